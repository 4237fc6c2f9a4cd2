"""jaxpt_test: one py_test per tests/test_*.py file, run by pytest (tools/bazel/pytest_main.py)."""

def jaxpt_test(name, size = "medium", tags = [], deps = [], data = [], **kwargs):
    """py_test `name` for tests/`name`.py: pytest runs that file (the slow-marked tests left out)."""
    native.py_test(
        name = name,
        srcs = [name + ".py", "//tools/bazel:pytest_main.py"],
        main = "//tools/bazel:pytest_main.py",
        args = ["tests/%s.py" % name, "-m", "'not slow'"],
        python_version = "PY3",
        size = size,
        tags = tags,
        deps = deps + [":support"],
        data = data + ["//:setup.cfg"],
        **kwargs
    )
