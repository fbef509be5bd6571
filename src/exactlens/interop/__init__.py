"""Models from other tools as exactlens models: ``exactlens.interop.tracr`` turns compiled RASP
programs (tracr) into ExactTransformers with their tasks. Importing this package imports no
other tool; each submodule imports its tool when it is first used."""
