"""Imports lm-evaluation-harness's own modules from a checkout of its source without installing it: the heavy packages
its task module imports at the top (datasets, tqdm, sacrebleu, dill) are stubbed, and none of them is reached by the
functions the fixture scripts call (prompt building, samplers, rolling windows).

    git -C <harness repo> archive HEAD lm_eval | tar -x -C /tmp/lmeval
    import harness_source; harness_source.load("/tmp/lmeval")
"""
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import sys
from unittest.mock import MagicMock

STUB = {"datasets", "tqdm", "sacrebleu", "dill"}


class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        m = MagicMock()
        m.__path__, m.__spec__, m.__name__ = [], spec, spec.name
        return m

    def exec_module(self, module):
        pass


class _Stubs(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] not in STUB:
            return None
        return importlib.machinery.ModuleSpec(name, _Loader(), is_package=True)


def load(root):
    """Puts the harness's source folder `root` first on the import path, with the stubs."""
    sys.path.insert(0, root)
    version = importlib.metadata.version
    importlib.metadata.version = lambda n: "0.0" if n in ("lm_eval", "lm-eval") else version(n)
    sys.meta_path.insert(0, _Stubs())
