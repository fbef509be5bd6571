"""Adding a thing is one file: a temporary plug-in whose entry points name three modules, each written here as
one file, adds a diff part (its step, JSON section, summary key, text and page section), a verb (its flags,
API function, checks and text) and a construction (built, listed and verified exactly). Each appears through
the public entries only, the way an installed plug-in's would."""

from __future__ import annotations

import json
import sys
import textwrap
from importlib.metadata import EntryPoint

import pytest

from exactlens import plugins
from exactlens.cli import main

TOY_PART = '''
from exactlens.analysis.diff.parts import Done, Part, register_part
from exactlens.markup import esc, table


def run(ctx, request):
    words = sum(len(r.ids) for r in ctx.values["words"])
    return Done({"toy_words": {"words": words, "lengths": list(ctx.lengths)}}, {"toy_word_count": words})


def text(result):
    return [f"  toy: {result['toy_words']['words']} words"]


def page(result):
    return ["<h3>Toy part</h3>", f"<p>{esc(result['toy_words']['lengths'])}</p>",
            table(["words"], [[result["toy_words"]["words"]]], 0)]


def register():
    register_part(Part("toy", run, ("words",), ("toy_words",), ("toy_word_count",), text=text, page=page,
                       order=95, page_order=15, help="counts the words both models ran"))
'''

TOY_VERB = '''
from dataclasses import dataclass

from exactlens.requests import Int, Text, option
from exactlens.results import Result, View
from exactlens.verbs import VerbSpec, register_verb


@dataclass(frozen=True)
class ToyRequest:
    word: str = option(kind=Text(), positional=True, help="a word")
    times: int = option(2, kind=Int(1, 5), help="how many times (1-5)")


def run(request):
    return Result("toyecho", {"echo": " ".join([request.word] * request.times), "times": request.times})


def text(data):
    return f"echo: {data['echo']}"


def register():
    register_verb(VerbSpec("toyecho", "say a word several times", ToyRequest, run,
                           views={"toyecho": View(lambda data: [("echo", data["echo"])], text)}))
'''

TOY_CONSTRUCTION = '''
from exactlens.constructions import Construction, register as register_construction
from exactlens.constructions.cookbook import Head, Layer, Program, Readout, compile
from exactlens.tasks import First


def build(dtype="float32"):
    """FIRST as a Cookbook program: [CLS] attends (unique-hard) to position 1 and copies +-1/2 into s."""
    head = Head.build(query={"cls": [1.0]}, key={"at_1": [1.0]},
                      value={("s", "one"): 0.5, ("s", "zero"): -0.5, ("s", "cls"): -0.5})
    program = Program(vocab=First().vocab, embedding={"0": {"zero": 1.0}, "1": {"one": 1.0}, "[CLS]": {"cls": 1.0}},
                      positions={"I[i=1]": {"at_1": 1.0}},
                      layers=(Layer(heads=(head,), weighting="unique_hard_left"),),
                      readout=Readout({"accept": {"s": 1.0}}, kind="sigmoid"), name="toy-first")
    return compile(program, dtype)


def register():
    register_construction(Construction("toy-first", "first", build, "toy plug-in", "FIRST by one hard head"))
'''


@pytest.fixture
def toy_plugin(monkeypatch, tmp_path):
    """The three files as a plug-in with three entry points; every registry is restored afterwards."""
    from exactlens.analysis.diff import parts
    from exactlens.constructions import REGISTRY
    from exactlens.results import VIEWS
    from exactlens.verbs import VERBS

    plugins.load_plugins()  # the real plug-ins first, so that the state restored afterwards is "loaded"
    for name, source in (("toy_part", TOY_PART), ("toy_verb", TOY_VERB), ("toy_construction", TOY_CONSTRUCTION)):
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(plugins._state, "loaded", False)
    monkeypatch.setitem(plugins._state, "failure", None)
    monkeypatch.setattr(plugins, "_loaded", [])
    points = [EntryPoint(name, f"{name}:register", plugins.GROUP) for name in ("toy_part", "toy_verb",
                                                                              "toy_construction")]
    monkeypatch.setattr(plugins, "entry_points", lambda group: points if group == plugins.GROUP else [])
    monkeypatch.setattr(parts, "_REGISTERED", {})
    yield
    for registry, key in ((REGISTRY, "toy-first"), (VERBS, "toyecho"), (VIEWS, "toyecho")):
        dict.pop(registry, key, None)
    for module in ("toy_part", "toy_verb", "toy_construction"):
        sys.modules.pop(module, None)


def test_a_diff_part_in_one_file_shows_in_the_json_the_text_and_the_page(toy_plugin, capsys, tmp_path):
    from exactlens.analysis.diff import diff
    from exactlens.verbs.diff import format_diff_text
    from exactlens.viz.diff_page import diff_html

    result = diff("first-flawed", "first", lengths=[2, 3], strings=4, parts=("behaviour", "toy"))
    words = sum(row["strings"] for row in result["behaviour"]["rows"])  # counted by the behaviour part
    assert result["toy_words"] == {"words": words, "lengths": [2, 3]}
    assert result["summary"]["toy_word_count"] == words
    assert result["settings"]["parts"] == ["behaviour", "toy"]
    text = format_diff_text(result).splitlines()
    assert text[-1] == f"  toy: {words} words" and text[1].startswith("  accuracy trained")  # in the parts' order
    page = diff_html(result)
    assert "<h3>Toy part</h3><p>[2, 3]</p>" in page.replace("\n", "")
    assert page.index("<h3>Behaviour</h3>") < page.index("<h3>Toy part</h3>")  # its page_order: after behaviour

    # the command line: --parts accepts it, the text and the JSON have it, the page file too
    assert main(["diff", "first-flawed", "--against", "first", "--lengths", "2,3", "--strings", "4", "--parts",
                 "behaviour,toy", "--html", str(tmp_path / "d.html")]) == 0
    assert f"  toy: {words} words" in capsys.readouterr().out.splitlines()
    assert "<h3>Toy part</h3>" in (tmp_path / "d.html").read_text()
    assert main(["diff", "first-flawed", "--against", "first", "--lengths", "2,3", "--strings", "4", "--parts",
                 "toy", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["toy_words"]["words"] == words
    assert main(["diff", "first-flawed", "--against", "first", "--parts", "toys"]) == 2
    err = capsys.readouterr().err
    assert "unknown 'toys'" in err and err.rstrip().endswith("circuit, toy")  # the allowed names, the toy's last


def test_a_verb_in_one_file_is_a_command_and_a_function(toy_plugin, capsys):
    import exactlens.api as el
    from exactlens.errors import ExactLensError

    assert main(["toyecho", "hi", "--times", "3"]) == 0
    assert capsys.readouterr().out.strip() == "echo: hi hi hi"
    assert main(["toyecho", "hi", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"echo": "hi hi", "times": 2}
    assert main(["toyecho", "hi", "--times", "9"]) == 2  # the request's check, one line
    assert "--times" in capsys.readouterr().err
    assert dict(el.toyecho("ho", times=1)) == {"echo": "ho", "times": 1}
    with pytest.raises(ExactLensError, match="times"):
        el.toyecho("ho", times=0)


def test_a_construction_in_one_file_is_listed_and_exact(toy_plugin, capsys):
    assert main(["list"]) == 0
    assert "toy-first" in capsys.readouterr().out
    assert main(["verify", "toy-first", "--lengths", "0:6", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["results"]  # every word of length 0..6
    assert [r["length"] for r in rows] == list(range(7))
    assert all(r["accuracy"] == 1.0 and r["exhaustive"] for r in rows)
