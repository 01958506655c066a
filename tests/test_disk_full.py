"""A full disk, for real: a small tmpfs mounted in a private mount namespace (``unshare``),
where stepplan writes until the device has no room. The error is one line that names
the folder and says what was kept; the decoys and an earlier run stay as they were."""

from __future__ import annotations

import hashlib
import shlex
import shutil
import subprocess
import sys

import pytest

STEPPLAN = [sys.executable, "-c", "import sys; from stepplan.sim.cli import main; sys.exit(main())"]
BIG = "synthetic:n=3000,rate=50,prompt=uniform:16:256,output=uniform:1:64"


def _can_mount() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k none /mnt"],
        capture_output=True,
    )
    return probe.returncode == 0


pytestmark = pytest.mark.skipif(not _can_mount(), reason="no private tmpfs (unshare -rm)")


def on_small_disk(disk, size, *commands):
    """Run ``commands`` (argument lists) with ``disk`` a tmpfs of ``size``; each one's exit
    code and stderr, then every file left there with its sha256."""
    script = [f"mount -t tmpfs -o size={size} none {shlex.quote(str(disk))}", f"cd {disk}"]
    for command in commands:
        script.append(f"{shlex.join(command)} 2>>err; echo $? >> codes")
    script.append("find . -type f ! -name err ! -name codes -exec sha256sum {} + | sort")
    script.append("echo ===; cat codes; echo ===; cat err")
    done = subprocess.run(
        ["unshare", "-rm", "bash", "-c", " && ".join(script[:2]) + "; " + "; ".join(script[2:])],
        capture_output=True,
        text=True,
        timeout=300,
    )
    files, codes, err = done.stdout.split("===\n")
    return [int(c) for c in codes.split()], err.splitlines(), files.splitlines()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_run_that_fills_the_disk_keeps_nothing_and_says_so(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    decoy = b"the user's notes\n"
    make_decoy = ["python3", "-c", f"open('notes.txt', 'wb').write({decoy!r})"]
    codes, err, files = on_small_disk(
        disk, "200k", make_decoy, [*STEPPLAN, "simulate", BIG, "--quiet", "--out", "run"]
    )
    assert codes == [0, 2], err
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert err[0].startswith("stepplan: error: run: no space left on the device while writing")
    assert "steps in; nothing of this run was kept" in err[0]
    assert files == [f"{sha(decoy)}  ./notes.txt"]  # no folder, no staging, the decoy whole


def test_an_earlier_run_stays_when_the_new_one_fills_the_disk(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    small = [*STEPPLAN, "simulate", "--limit", "30", "--quiet", "--out", "run"]
    listing = "find run -type f -exec sha256sum {} + | sort > "
    before = ["sh", "-c", listing + str(tmp_path / "before.txt")]
    after = ["sh", "-c", listing + str(tmp_path / "after.txt")]
    again = [*STEPPLAN, "simulate", BIG, "--quiet", "--out", "run", "--overwrite"]
    codes, err, _ = on_small_disk(disk, "300k", small, before, again, after)
    assert codes == [0, 0, 2, 0], err
    assert len(err) == 1 and err[0].startswith("stepplan: error: run: no space left on the device")
    assert "the folder holds what it held before" in err[0]
    kept = (tmp_path / "before.txt").read_text()
    assert "run/steps.csv" in kept and (tmp_path / "after.txt").read_text() == kept


def test_a_report_on_a_full_disk_writes_nothing(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    run = [*STEPPLAN, "simulate", "--limit", "30", "--quiet", "--out", "run"]
    fill = ["python3", "-c", "open('fill', 'wb').write(bytes(200_000))"]
    report = [*STEPPLAN, "report", "run", "--out", "r.html"]
    codes, err, files = on_small_disk(disk, "400k", run, fill, report)
    assert codes[:2] == [0, 0] and codes[2] == 2, err
    assert err == [
        f"stepplan: error: r.html: no space left on the device of {disk}; nothing written "
        "(it was not there before)"
    ]
    assert not [line for line in files if "r.html" in line or "partial" in line]
