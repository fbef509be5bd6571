"""The papers: each a plug-in of exactlens (entry-point group ``exactlens.plugins``) that registers its
constructions, tasks, presets, figures, report sections and command-line verbs. The core never imports
these packages."""
