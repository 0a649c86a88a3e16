"""Getting models onto disk and into memory: the embedded packages (``embedded``), any other
source a config names (``loader``), and the tiny random model the tests run (``tiny``).

The engine takes what ``loader.load_model`` gives (``LoadedModel``) and never fetches anything.
"""
