"""@local_python: the environment's Python interpreter as Bazel's Python toolchain (no download).

The interpreter is $PYTHON_BIN_PATH, else `python3` on PATH, resolved to its real executable (`sys.executable`: a
pyenv shim or a venv's python is followed to the interpreter it runs, keeping that environment's site-packages).
"""

def _local_python_impl(rctx):
    python = rctx.os.environ.get("PYTHON_BIN_PATH") or rctx.which("python3")
    if not python:
        fail("no python3 on PATH (set PYTHON_BIN_PATH to the interpreter that has jaxpt's dependencies)")
    result = rctx.execute([python, "-c", "import sys; print(sys.executable)"])
    if result.return_code != 0:
        fail("%s failed: %s" % (python, result.stderr))
    interpreter = result.stdout.strip()
    rctx.file("BUILD", """\
load("@bazel_tools//tools/python:toolchain.bzl", "py_runtime_pair")

py_runtime(
    name = "python3",
    interpreter_path = "{interpreter}",
    python_version = "PY3",
)

py_runtime_pair(
    name = "runtime_pair",
    py3_runtime = ":python3",
)

toolchain(
    name = "toolchain",
    toolchain = ":runtime_pair",
    toolchain_type = "@bazel_tools//tools/python:toolchain_type",
)
""".format(interpreter = interpreter))

local_python = repository_rule(
    implementation = _local_python_impl,
    environ = ["PATH", "PYTHON_BIN_PATH"],
    local = True,
)
