"""Issue 18 §2: numbers at the edges of ``python -m gpumem`` and how a run ends (Ctrl-C, a closed
pipe, a failed run). Every bad input is one line on stderr and exit status 2, answered at once.

The bounds are the course's policy (gpumem.cli_verbs: BOUNDS, MAX_PARAMS, MAX_SEQ, MAX_TOKENS);
they are written here as the numbers a learner reads in ``--help``, not read back from the code.
Most cases call ``gpumem.cli.main`` in-process; a subprocess only where the process boundary is the
point: a former hang (with a timeout), the torch import, a closed pipe and SIGINT.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpumem import cli, units

ROOT = Path(__file__).resolve().parents[1]


def main(capsys, *argv) -> tuple[int, str]:
    code = cli.main(list(argv))
    return code, capsys.readouterr().err


def one_line_exit_2(capsys, *argv) -> str:
    code, err = main(capsys, *argv)
    assert code == 2, (argv, err)
    assert err.count("\n") == 1 and err.startswith("gpumem: error: "), err
    assert "Traceback" not in err and len(err) < 400, err
    return err


# (argv, words in the one line). Each was a traceback, a hang or a wrong answer before issue 18,
# or sits on a bound's edge.
BAD = [
    (["estimate", "--params", "1e400"], "too large; accepted: 1 to 10^15"),            # was OverflowError
    (["estimate", "--params", "1e99999"], "too large"),                             # failed inside its message
    (["estimate", "--params", "1001T"], "too large"),                               # 10^15 + 10^12
    (["estimate", "--params", "1000000000000001"], "too large"),                    # 10^15 + 1
    (["estimate", "--params", "70B", "--largest-layer", "1e400"], "--largest-layer"),
    (["estimate", "--params", "٧٠B"], "--params must be a positive count"),          # Arabic-Indic digits
    (["estimate", "--params", "1_000"], "--params must be a positive count"),
    (["estimate", "--model", "llama-3-8b", "--seq", "1e400"], "--seq must be a positive whole number"),
    (["estimate", "--model", "llama-3-8b", "--seq", "1e3"], "4096, 4k or 8K"),       # no exponent: not a named form
    (["estimate", "--model", "llama-3-8b", "--seq", "1.5k"], "4096, 4k or 8K"),
    (["estimate", "--model", "llama-3-8b", "--seq", "16777217"], "too large; accepted: 1 to 16,777,216"),
    (["estimate", "--model", "llama-3-8b", "--seq", "16385k"], "too large"),
    (["estimate", "--model", "llama-3-8b", "--micro-batch", "65537"], "1 to 65,536"),
    (["estimate", "--model", "llama-3-8b", "--seq", "4k", "--micro-batch", "4097"], "16,781,312 tokens"),
    (["estimate", "--model", "llama-3-8b", "--gpus", "1000001"], "1 to 1,000,000"),
    (["estimate", "--model", "llama-3-8b", "--gpus", "８"], "--gpus must be a positive integer"),  # fullwidth 8
    (["trace", "--model", "tiny", "--seq", "1e30"], "--seq"),                        # was a 30-line torch traceback
    (["trace", "--model", "llama-3.1-405b", "--seq", "16384k", "--micro-batch", "64", "--attention", "naive"],
     "tokens per micro-batch"),                                                    # torch: storage size overflowed
    (["plan", "--model", "llama-3-8b", "--gpus", "8", "--global-batch", "16777217"], "1 to 16,777,216"),
    (["plan", "--model", "llama-3-8b", "--gpus", "8", "--top", "10001"], "1 to 10,000"),
    (["plan", "--model", "llama-3-8b", "--gpus", "8", "--gpu-mem", "1001TB"], "at most 1000TB"),
    (["plan", "--model", "llama-3-8b", "--gpus", "8", "--gpu-mem", "9" * 400 + "GB"], "too large"),  # was inf
    (["run", "zero", "--ranks", "65"], "1 to 64"),
    (["run", "zero", "--model", "llama-3-70b"], "too large for CPU ranks"),         # tried to build 70B on CPU
    (["run", "attention", "--seqs", "16k", "--heads", "64"], "64 GiB"),             # naive scores, 64 GiB
    (["run", "attention", "--seqs", ",".join(["256"] * 17)], "1 to 16 comma-separated"),
    (["run", "offload", "--ladder-mib", "99999999999"], "up to 4,096"),             # tried to allocate 104 PB
    (["run", "offload", "--steps", "101"], "up to 100"),
    (["run", "offload", "--nvme-path", "x" * 300], "File name too long"),          # was an OSError traceback
]
# Mistakes answered before torch loads (each took seconds of import first); checked in a subprocess
# that reports whether torch was imported.
BEFORE_TORCH = [["trace", "--model", "nope"], ["trace", "--model", "tiny", "--adamw", "foreach"],
                ["run", "attention", "--heads", "4", "--kv-heads", "3"], ["run", "zero", "--model", "llama-3-70b"]]


@pytest.mark.parametrize("argv, words", BAD, ids=[" ".join(a)[:60] for a, _ in BAD])
def test_bad_number_is_one_line_exit_2(argv, words, capsys):
    assert words in one_line_exit_2(capsys, *argv)


def test_a_huge_value_is_cut_in_the_line(capsys):
    """argparse echoes a bad value whole: a 5,000-digit --zero was a 5,000-character line."""
    for argv in (["estimate", "--model", "tiny", "--zero", "9" * 4000],
                 ["estimate", "--model", "tiny", "--zero", "9" * 5000],
                 ["estimate", "--params", "9" * 5000],
                 ["estimate", "--model", "x" * 100_000]):                  # the library's message, cut too
        err = one_line_exit_2(capsys, *argv)             # which also checks: under 400 characters
        assert "(cut)" in err or "characters)" in err, err


@pytest.mark.parametrize("argv, key, value", [
    (["--params", "1e15"], "n_params", 10**15),                   # the bound itself is accepted
    (["--params", "1000T"], "n_params", 10**15),
    (["--params", "0.000001e21"], "n_params", 10**15),
    (["--model", "tiny", "--seq", "16384k"], "seq", 2**24),
    (["--model", "tiny", "--seq", "4k", "--micro-batch", "4096"], "micro_batch", 4096),   # 2^24 tokens
    (["--model", "tiny", "--gpus", "1000000"], "gpus", 10**6),
])
def test_the_bound_itself_is_accepted(argv, key, value, capsys):
    import json
    assert cli.main(["estimate", *argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[key] == value


def test_count_parser_judges_size_before_arithmetic():
    """1e100000000 built a 100-million-digit integer; now the exponent's size decides at once."""
    start = time.process_time()
    for text in ("1e100000000", "1e" + "9" * 90, "0.0000001e99999999"):
        with pytest.raises(OverflowError):
            units.parse_count(text, {"": 1}, 10**15)
    assert units.parse_count("8.03B", {"": 1, "B": 10**9}, 10**15) == 8_030_000_000
    assert units.parse_count("0.5", {"": 1}, 10**15) is None
    assert units.parse_count("9" * 101, {"": 1}, 10**15) is None      # over 100 characters
    assert time.process_time() - start < 1.0                           # (the old code: never returned)


def _gpumem(*argv, timeout=60):
    return subprocess.run([sys.executable, "-m", "gpumem", *argv], capture_output=True, text=True,
                          cwd=ROOT, timeout=timeout)


@pytest.mark.parametrize("argv", [["estimate", "--params", "1e100000000"],
                                  ["plan", "--model", "llama-3-8b", "--gpus", "8", "--seq", "1e400"],
                                  ["plan", "--model", "llama-3-8b", "--gpus", "1000000000"]])
def test_former_hangs_answer_at_once(argv):
    """Each hung when the issue was filed (an exact hundred-million-digit integer; a 10^400-token
    plan; divisors counted to 10^9, since made O(sqrt n) by the planner, and now above the --gpus
    bound). Without torch they answer in a fraction of a second; 60 s is the hang's limit."""
    proc = _gpumem(*argv)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr


def test_mistakes_are_answered_before_importing_torch():
    """``trace --model nope`` imported torch first (7-10 s) and only then looked the name up."""
    code = ("import sys; from gpumem import cli\n"
            f"for argv in {BEFORE_TORCH!r}:\n"
            "    print(cli.main(argv), 'torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.stdout.split("\n")[:-1] == ["2 False"] * len(BEFORE_TORCH), proc
    assert proc.stderr.count("gpumem: error: ") == len(BEFORE_TORCH) and "unknown model 'nope'" in proc.stderr


def test_help_states_every_bound(capsys):
    texts = {}
    for verb in (["estimate"], ["plan"], ["run", "offload"], ["run", "attention"]):
        with pytest.raises(SystemExit):
            cli.main([*verb, "--help"])
        texts[verb[-1]] = " ".join(capsys.readouterr().out.split())
    assert "at most 10^15" in texts["estimate"] and "at most 16,777,216" in texts["estimate"]
    assert "at most 65,536" in texts["estimate"] and "at most 1,000,000" in texts["estimate"]
    for words in ("at most 1,000,000", "at most 16,777,216", "at most 10,000", "at most 1000TB"):
        assert words in texts["plan"], words
    assert "at most 4,096" in texts["offload"] and "at most 100" in texts["offload"]
    assert "at most 16,384" in texts["attention"] and "at most 64" in texts["attention"]


def test_ladder_larger_than_the_free_disk_is_refused(capsys, tmp_path):
    """The rung's file must fit the folder it is written to (the 4,096 MiB cap alone is not enough
    on a small disk). A real 2 MiB tmpfs (root only) takes a 4 MiB rung: refused before any byte."""
    small = tmp_path / "small"
    small.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(small)],
                             capture_output=True, text=True).returncode == 0
    if not mounted:
        pytest.skip("cannot mount a 2 MiB tmpfs here (root only)")
    try:
        err = one_line_exit_2(capsys, "run", "offload", "--nvme-path", str(small), "--ladder-mib", "4")
        assert "--ladder-mib 4 writes 4,194,304 bytes" in err and "2,097,152 free" in err, err
        assert list(small.iterdir()) == []
    finally:
        subprocess.run(["umount", "-l", str(small)], capture_output=True)


def test_closed_pipe_ends_quietly_with_141():
    """``plan ... | head -1`` ended in a BrokenPipeError traceback. The reader here is gone before
    the first byte is written, the worst case of ``head -1``: no traceback, exit 128 + SIGPIPE."""
    read, write = os.pipe()
    proc = subprocess.Popen([sys.executable, "-m", "gpumem", "plan", "--model", "llama-3-8b", "--gpus", "8"],
                            stdout=write, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    os.close(write)
    os.close(read)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGPIPE and err == "", err


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="waits for torch's library in /proc/PID/maps")
def test_ctrl_c_is_one_line_exit_130():
    """Ctrl-C during a verb printed a traceback. SIGINT is sent once the verb is importing torch
    (its library is mapped), so it lands inside the verb, as a learner's Ctrl-C does."""
    proc = subprocess.Popen([sys.executable, "-m", "gpumem", "trace", "--model", "llama-3.1-405b", "--full"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # not ignored
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if "libtorch" in Path(f"/proc/{proc.pid}/maps").read_text():
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    # 130 from main; a shell also shows 130 for a child killed by SIGINT (-2 here), which CPython
    # does itself when the interrupt went through C code that ran Python (pybind11's exec)
    assert proc.returncode in (130, -signal.SIGINT), (proc.returncode, err)
    assert err == "gpumem: interrupted (Ctrl-C)\n", err


def test_run_failure_is_one_line_exit_1(capsys, monkeypatch):
    """A failed run (gpumem.errors.RunFailure, e.g. the launcher's RankError) is one line, exit 1;
    --verbose adds the rank's story before it. The experiment is replaced by one that fails."""
    from gpumem import chapters
    from gpumem.errors import RunFailure

    def fails(name, **kwargs):
        raise RunFailure("rank 1 was killed by SIGKILL", detail="Traceback (most recent call last):\n  ...")
    monkeypatch.setattr(chapters, "run_experiment", fails)
    code, err = main(capsys, "run", "zero")
    assert code == 1 and err == "gpumem: run failed: rank 1 was killed by SIGKILL\n"
    code, err = main(capsys, "run", "zero", "--verbose")
    assert code == 1 and err.startswith("Traceback") and err.endswith("run failed: rank 1 was killed by SIGKILL\n")

    def interrupted(name, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(chapters, "run_experiment", interrupted)
    assert main(capsys, "run", "zero") == (130, "gpumem: interrupted (Ctrl-C)\n")

    from gpumem.errors import Stopped

    def terminated(name, **kwargs):    # what the disk ladder raises on SIGTERM
        raise Stopped("run stopped by SIGTERM: its test file removed", 15)
    monkeypatch.setattr(chapters, "run_experiment", terminated)
    assert main(capsys, "run", "offload") == (143, "gpumem: run stopped by SIGTERM: its test file removed\n")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (a device that is always full)")
def test_output_to_a_full_device_is_one_line_exit_1():
    """``estimate ... > /dev/full`` ended in an OSError traceback (errno 28) from print."""
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "gpumem", "estimate", "--model", "tiny"], stdout=full,
                              stderr=subprocess.PIPE, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr == "gpumem: error: cannot write the output: No space left on device\n", proc.stderr


def test_a_closed_stdout_is_no_traceback():
    """``python -m gpumem plan ... >&-``: Python starts with sys.stdout None."""
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-c", "import sys; sys.stdout.close(); sys.stdout = None; "
                           "from gpumem import cli; raise SystemExit(cli.main(['estimate', '--model', 'tiny']))"],
                          capture_output=True, text=True, timeout=60)
    assert "Traceback" not in proc.stderr and proc.returncode in (0, 1), proc.stderr
