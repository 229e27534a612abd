import os

# Before torch loads libgomp, which reads it once. Parallel workers and the processes they launch put more
# OpenMP threads than cores on the 2-core CI box, and libgomp's default (spinning for a while at every
# barrier) then burns the cores that the other threads wait for: measured on five CPU-bound test files
# under `-n 4`, 175-240 s of CPU and 143-225 s of wall time by default, 90-97 s and 85-96 s passive.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# Inductor compiles serially in the process that compiles. Its default on a 2-core box is a pool of 2 compile
# workers, fresh interpreters that each import torch and inductor again, started by every test process and
# every command a test launches that compiles (the lab's steps, `gpt bench --compile`...): measured on
# test_lenet_step's compile case with a cold cache, 37 s of CPU with the pool, 29 s without (four compile-heavy
# files together: 195 s, 190 s). The kernels
# compiled are the same either way. The environment carries it into the processes the tests launch.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
# One intra-op thread in every test process and every process a test launches: `make test` runs 3 pytest
# workers on the 2-core CI box, and each launched command (the lab's steps, `trainlab train`, torchrun's
# ranks) is one more; a second thread per process only adds synchronisation (five CPU-bound files in-process:
# 91 s of CPU and 50 s of wall time with 2 threads, 78 s and 41 s with 1; test_lenet_step's tolerances hold
# with either). Set before torch loads, so torch's default is 1 everywhere; a test may still ask for more.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

# Each pytest-xdist worker gets its own range of TCP ports for the gloo tests' MASTER_PORT
# (`distributed.spawn.free_port`; 500 ports per worker from 20000, below Linux's ephemeral range), so two
# workers never draw the same port.
_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if _worker.startswith("gw") and _worker[2:].isdigit():
    _lo = 20000 + 500 * (int(_worker[2:]) % 24)
    os.environ["TRAINLAB_TEST_PORTS"] = f"{_lo}-{_lo + 500}"


def pytest_collection_modifyitems(config, items):
    # the slow end-to-end cases start first: run in parallel, they would otherwise be the tail of the run.
    # `make test` hands whole files to its workers in this order (loadscope), so their files go first.
    items.sort(key=lambda item: "slow" not in item.keywords)  # stable: the order is kept otherwise
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (none visible)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


def load_ext(load):
    """A C++ (and, on a GPU, CUDA) extension, built by `load`. Without a compiler on a CPU machine its
    tests skip (test_gelu_cpp.py tests that error itself); on a machine with a GPU a failed build fails
    them: the GPU suite must never report "skipped" for a broken build."""
    from trainlab.errors import HardwareError

    try:
        return load()
    except HardwareError as e:
        if torch.cuda.is_available():
            raise
        pytest.skip(str(e))


def load_gelu_ext():
    """trainlab's compiled library, with GELU's kernels (see `load_ext`)."""
    from trainlab.ops.gelu import load

    return load_ext(load)


@pytest.fixture(scope="session")
def gelu_ext():
    return load_gelu_ext()


def skipped_by_design(row, case, impl, dtype) -> bool:
    """The fused op's unfused rungs (python, triton, cuda) are not checked in bf16 (they round the conv
    output before pooling, which moves the winners), nor with average pooling (which they do not have); the
    fused cpp rung is. Anything else must run."""
    if not row["skipped"]:
        return False
    assert case.op == "conv_relu_pool2d" and impl not in ("aten", "cpp") and row["ok"] is None, row
    if case.impls is not None:
        assert impl not in case.impls and row["reason"].startswith("this rung does not have"), row
    else:
        assert dtype == torch.bfloat16 and row["reason"].startswith("not checked in bfloat16"), row
    return True


@pytest.fixture(autouse=True)
def _fp32_matmuls_after_every_test():
    """A test that trains with --tf32 on or --matmul-precision medium sets a process-wide switch (medium lets
    oneDNN run CPU matmuls in bf16); the next test in the same worker must not inherit it, or its fp32
    tolerances would be checked against bf16 arithmetic."""
    yield
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.allow_tf32 = False
