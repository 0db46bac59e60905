"""``make image`` (deploy/build_image.py): what it asks the builder for, without building
(the build itself runs once per session for the image tests: tests/deploy/image_rootfs.py)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.needs import REPO_ROOT, need

SCRIPT = REPO_ROOT / "deploy" / "build_image.py"


@pytest.fixture(scope="module")
def build_image():
    spec = importlib.util.spec_from_file_location("build_image", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _args(argv: list[str]) -> dict[str, str]:
    pairs = [argv[i + 1] for i, word in enumerate(argv) if word == "--build-arg"]
    return dict(pair.split("=", 1) for pair in pairs)


def test_buildah_mounts_the_wheels_and_the_ca_at_fixed_paths(build_image, tmp_path) -> None:
    """Fixed in-build paths: a build argument that changed every build (a random port of a
    wheel server) invalidated every layer after it — the cache must hold between builds."""
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    argv = build_image.build_command(
        "buildah", "localhost/fedtune:9", {"TORCH_VARIANT": "cpu"}, wheels=tmp_path, ca_bundle=ca
    )
    assert argv[:5] == ["buildah", "bud", "--isolation", "chroot", "--layers"]
    assert f"{tmp_path}:{build_image.BUILD_WHEELS}:ro" in argv
    assert f"{ca}:{build_image.BUILD_CA}:ro" in argv
    assert _args(argv) == {
        "TORCH_VARIANT": "cpu",
        "TORCH_FIND_LINKS": build_image.BUILD_WHEELS,
        "PIP_CERT": build_image.BUILD_CA,
    }
    again = build_image.build_command(
        "buildah", "localhost/fedtune:9", {"TORCH_VARIANT": "cpu"}, wheels=tmp_path, ca_bundle=ca
    )
    assert again == argv and argv[-1] == str(REPO_ROOT)


def test_docker_builds_the_dockerfile_as_it_is(build_image, tmp_path) -> None:
    argv = build_image.build_command(
        "docker", "t", {"TORCH_VARIANT": "cpu"}, wheels=tmp_path, ca_bundle=tmp_path / "ca.pem"
    )
    assert argv[:2] == ["docker", "build"] and "--volume" not in argv
    assert _args(argv) == {"TORCH_VARIANT": "cpu"}  # official base, PyTorch's index


def test_the_tag_and_the_torch_pin(build_image) -> None:
    import tomllib

    version = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert build_image.default_tag("cpu") == f"localhost/fedtune:{version}"
    assert build_image.default_tag("cuda") == f"localhost/fedtune:{version}-cuda"
    assert build_image.torch_pin() == "2.13.0"


def test_wheels_are_found_only_with_the_pinned_cpu_build(build_image, tmp_path) -> None:
    assert build_image.find_torch_wheels(None) in (None, Path("/opt/wheels"))
    with pytest.raises(build_image.BuildError, match=r"no torch-2\.13\.0\+cpu wheel"):
        build_image.find_torch_wheels(tmp_path)
    (tmp_path / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
    assert build_image.find_torch_wheels(tmp_path) == tmp_path


def test_a_missing_builder_is_one_line_exit_1(tmp_path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--engine", "podman"],
        capture_output=True,
        text=True,
        env={"PATH": str(tmp_path)},
    )
    assert done.returncode == 1
    assert done.stderr.strip() == "build_image: error: podman is not installed"


def _fake_debootstrap(bin_dir: Path, failures: int, mount_proc: bool = False) -> Path:
    """A ``debootstrap`` that fails its first ``failures`` runs as a mirror mid-sync does,
    leaving its log in the target (and, with ``mount_proc``, a file system mounted at its
    ``/proc``, as the real one leaves it), then makes the target."""
    count = bin_dir / "runs"
    script = bin_dir / "debootstrap"
    proc = (  # read-only once written, as /proc's files cannot be removed
        'mkdir -p "$target/proc"; mount -t tmpfs fake "$target/proc"; : > "$target/proc/1"\n'
        'mount -o remount,ro "$target/proc"\n'
    )
    script.write_text(
        "#!/bin/sh\n"
        f'n=$(cat "{count}" 2>/dev/null || echo 0); n=$((n + 1)); echo $n > "{count}"\n'
        'target="$4"\n'
        'if [ -e "$target/proc/1" ]; then echo "E: $target is not empty" >&2; exit 2; fi\n'
        'mkdir -p "$target/debootstrap"\n'
        + (proc if mount_proc else "")
        + f'if [ "$n" -le {failures} ]; then\n'
        '  echo "I: Retrieving Packages" > "$target/debootstrap/debootstrap.log"\n'
        '  echo "E: Hash Sum mismatch (run $n)" >> "$target/debootstrap/debootstrap.log"\n'
        '  echo "E: Couldn\'t download packages (run $n)" >&2\n'
        "  exit 1\n"
        "fi\n"
        'rm -r "$target/debootstrap"; mkdir -p "$target/usr/bin"\n'
    )
    script.chmod(0o755)
    return count


def _mounted(path: Path) -> bool:
    return any(line.split()[4] == str(path) for line in open("/proc/self/mountinfo"))


def _can_mount() -> str | None:
    """None when this process may mount file systems (root), else why not."""
    return None if os.geteuid() == 0 else "mounting a tmpfs needs root"


def test_debootstrap_is_tried_again_from_scratch_and_says_why(
    build_image, tmp_path, monkeypatch, capsys
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    runs = _fake_debootstrap(bin_dir, failures=1)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    rootfs = tmp_path / "rootfs"
    build_image.debootstrap(rootfs, tries=3, wait_s=0.0)
    assert runs.read_text().strip() == "2"
    assert (rootfs / "usr/bin").is_dir() and not (rootfs / "debootstrap").exists()
    said = capsys.readouterr().err
    assert "debootstrap failed (exit 1), trying again" in said
    assert "E: Hash Sum mismatch (run 1)" in said


def test_debootstrap_failing_every_try_is_one_error_with_its_log(
    build_image, tmp_path, monkeypatch
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    runs = _fake_debootstrap(bin_dir, failures=10)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    with pytest.raises(build_image.BuildError) as raised:
        build_image.debootstrap(tmp_path / "rootfs", tries=2, wait_s=0.0)
    assert runs.read_text().strip() == "2"
    assert str(raised.value) == (
        "debootstrap failed (exit 1) 2 times: I: Retrieving Packages | E: Hash Sum mismatch "
        "(run 2) || E: Couldn't download packages (run 2)"
    )


def test_a_failed_debootstrap_leaving_proc_mounted_is_unmounted_and_tried_again(
    build_image, tmp_path, monkeypatch, capsys
) -> None:
    """The real failure on fresh machines: debootstrap's target keeps its /proc mounted, and
    removing the target for the next try failed on /proc's files."""
    need("image", _can_mount())
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    runs = _fake_debootstrap(bin_dir, failures=1, mount_proc=True)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin:/usr/sbin:/sbin")
    rootfs = tmp_path / "root fs"  # a space: mountinfo writes it as \\040
    try:
        build_image.debootstrap(rootfs, tries=2, wait_s=0.0)
        assert runs.read_text().strip() == "2"
        assert (rootfs / "usr/bin").is_dir()
        assert "E: Hash Sum mismatch (run 1)" in capsys.readouterr().err
    finally:
        unmounted = build_image.unmount_under(rootfs)  # the second run's own mount
    assert unmounted == [str(rootfs / "proc")]
    assert not _mounted(rootfs / "proc")


def test_unmounting_under_a_directory_takes_the_deepest_first_and_nothing_beside_it(
    build_image, tmp_path
) -> None:
    need("image", _can_mount())
    inner, beside = tmp_path / "root/proc", tmp_path / "rootx"
    for point in (inner, beside):
        point.mkdir(parents=True)
        subprocess.run(["mount", "-t", "tmpfs", "fake", str(point)], check=True)
    nested = inner / "sys"
    nested.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "fake", str(nested)], check=True)
    try:
        assert sorted(build_image.unmount_under(tmp_path / "root")) == [str(inner), str(nested)]
        assert not _mounted(inner) and not _mounted(nested)
        assert _mounted(beside)  # a sibling whose name starts the same is not under it
    finally:
        build_image.unmount_under(beside)
    assert not _mounted(beside)


def test_a_second_build_waits_for_the_first_to_release_the_cache(
    build_image, tmp_path, capsys
) -> None:
    entered = []

    def second() -> None:
        with build_image.build_lock(tmp_path / "cache"):
            entered.append(time.monotonic())

    err = ""
    with build_image.build_lock(tmp_path / "cache"):
        waiter = threading.Thread(target=second)
        waiter.start()
        deadline = time.monotonic() + 30
        while "waiting for another build" not in err and time.monotonic() < deadline:
            time.sleep(0.01)
            err += capsys.readouterr().err
        assert "waiting for another build" in err, (  # it found the lock taken ...
            f"the second build said no wait for the lock in 30 s: {err!r}"
        )
        assert not entered  # ... held by the first
        released = time.monotonic()
    waiter.join(timeout=30)
    assert entered and entered[0] >= released
