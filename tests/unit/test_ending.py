"""gpulayer.proc.ending: a command's process ends with its status and its output, threads or none."""
import subprocess
import sys
import textwrap

import pytest


def _run(body: str) -> subprocess.CompletedProcess:
    code = "import atexit, logging, sys, threading, time\n" \
           "from gpulayer.proc.ending import run_and_end\n" + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("result, status", [(0, 0), (3, 3), (None, 0), ("no such job", 1), (256 + 7, 7)])
def test_a_thread_still_running_skips_the_shutdown_but_not_the_output(result, status):
    done = _run(f"""
        logging.basicConfig(stream=sys.stderr, format="%(message)s", level=logging.INFO)
        atexit.register(lambda: print("atexit ran"))
        threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
        def main():
            sys.stdout.write("partial line, no newline")  # still buffered: a pipe
            logging.getLogger("x").info("logged")
            return {result!r}
        run_and_end(main)
    """)
    assert done.returncode == status, done.stderr
    assert done.stdout == "partial line, no newline"  # flushed; the shutdown (atexit) skipped
    assert "logged" in done.stderr and "Traceback" not in done.stderr
    if isinstance(result, str):
        assert result in done.stderr


def test_a_process_with_one_thread_exits_as_usual():
    done = _run("""
        atexit.register(lambda: print("atexit ran"))
        def main():
            raise SystemExit(4)
        run_and_end(main)
    """)
    assert (done.returncode, done.stdout) == (4, "atexit ran\n")


def test_a_closed_stdout_does_not_turn_into_a_traceback():
    code = ("import sys, threading, time\nfrom gpulayer.proc.ending import run_and_end\n"
            "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
            "def main():\n    sys.stdout.write('x' * 1000000)\n    return 0\nrun_and_end(main)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.read(10)
    proc.stdout.close()  # `gpulayer ... | head -c 10`
    _, err = proc.communicate(timeout=60)
    assert b"Traceback" not in err
