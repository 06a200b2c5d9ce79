"""A job that hangs fails its test with every process's stack, not only its log."""
import sys

import pytest

from conftest import Job


def test_a_hung_jobs_failure_shows_each_processs_stack():
    code = ("import subprocess, sys, time\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import time\\n"
            "def waits_in_the_child(): time.sleep(60)\\nwaits_in_the_child()'])\n"
            "def waits_in_the_parent(): time.sleep(60)\n"
            "waits_in_the_parent()\n")
    job = Job([sys.executable, "-c", code])
    with pytest.raises(AssertionError) as failure:
        job.wait(3)
    message = str(failure.value)
    assert "did not finish within 3 s" in message
    assert "waits_in_the_parent" in message and "waits_in_the_child" in message, message
    assert job.proc.poll() is not None
