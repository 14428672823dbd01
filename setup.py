"""The build's compiled parts: `pigeon.core._compiled`, the Cython twins of `pigeon.core.hot`'s loops,
`pigeon.node._commit`, the journal's group commit without the GIL (pigeon.node.disk), and `pigeon.spark._decode`,
the Spark connector's split of stored messages into Arrow buffers (pigeon.spark.arrow). Everything else about the
package is in pyproject.toml. Optional: where no C compiler is found the install goes on without them and the
server runs the Python functions (the same results, slower)."""

from Cython.Build import cythonize
from setuptools import Extension, setup

setup(ext_modules=cythonize([Extension("pigeon.core._compiled", ["pigeon/core/_compiled.pyx"], optional=True),
                             Extension("pigeon.node._commit", ["pigeon/node/_commit.pyx"], optional=True),
                             Extension("pigeon.spark._decode", ["pigeon/spark/_decode.pyx"], optional=True)],
                            language_level=3))
