"""The foliofs Python module as a Python user sees it: file objects,
os.stat-like results, OSError with the errno. Run by scripts/python-tests.sh."""

import errno
import io
import os
import stat
import sys
import threading
import time

import pytest

import foliofs


@pytest.fixture
def volume(tmp_path):
    image = tmp_path / "vol.img"
    foliofs.mkfs(str(image), 64 << 20)
    with foliofs.Volume(str(image)) as volume:
        yield volume


def test_files_read_write_seek_and_close_as_python_files(tmp_path):
    image = str(tmp_path / "vol.img")
    foliofs.mkfs(image, 64 << 20)
    with foliofs.Volume(image) as volume:
        volume.makedirs("/docs/2026")
        with volume.open("/docs/2026/a.bin", "w+b") as f:
            assert f.write(b"hello world") == 11
            assert f.tell() == 11
            assert f.seek(6) == 6
            assert f.read(3) == b"wor"
            assert f.seek(-2, io.SEEK_END) == 9
            assert f.read() == b"ld"
            assert f.read() == b""
            f.fsync()
            assert f.readable() and f.writable() and f.seekable()
        assert f.closed
        with pytest.raises(ValueError):
            f.read()
        with volume.open("/docs/2026/a.bin", "ab") as f:
            f.write(b"!")
        with volume.open("/docs/2026/a.bin", "r+b") as f:
            assert f.truncate(5) == 5
    # Everything is on the image after closing and opening again.
    with foliofs.Volume(image) as volume:
        with volume.open("/docs/2026/a.bin") as f:
            assert f.read() == b"hello"
        assert volume.listdir("/docs") == ["2026"]


def test_stat_is_os_stat_shaped(volume):
    with volume.open("/f", "wb") as f:
        f.write(b"x" * 5000)
        by_handle = f.stat()
    result = volume.stat("/f")
    assert isinstance(result, os.stat_result)
    assert stat.S_ISREG(result.st_mode)
    assert result.st_size == 5000 == by_handle.st_size
    assert result.st_nlink == 1
    assert result.st_mtime_ns > 0 and abs(result.st_mtime - result.st_mtime_ns / 1e9) < 1
    assert stat.S_ISDIR(volume.stat("/").st_mode)
    assert result.st_ino == by_handle.st_ino != volume.stat("/").st_ino
    # Every field os.stat fills, by name and by index, equal by path and by
    # handle (the file is closed: nothing changes between the two).
    again = volume.stat("/f")
    assert tuple(again) == tuple(result) and again == result
    for name in ("st_mtime", "st_mtime_ns", "st_atime_ns", "st_ctime_ns", "st_blocks"):
        assert getattr(again, name) == getattr(result, name)
    assert result.st_blksize == 4096 and result.st_rdev == 0 and result.st_dev == 0
    assert (result.st_uid, result.st_gid) == (os.geteuid(), os.getegid())
    times = ((stat.ST_ATIME, "atime"), (stat.ST_MTIME, "mtime"), (stat.ST_CTIME, "ctime"))
    for index, name in times:
        nanos = getattr(result, f"st_{name}_ns")
        assert result[index] == nanos // 10**9
        assert abs(getattr(result, f"st_{name}") - nanos / 1e9) < 1e-6
    assert abs(result.st_mtime - time.time()) < 60


def test_errors_are_oserror_with_errno(volume):
    with pytest.raises(FileNotFoundError) as missing:
        volume.open("/nope")
    assert missing.value.errno == errno.ENOENT
    assert missing.value.filename == "/nope"
    volume.mkdir("/d")
    with pytest.raises(FileExistsError):
        volume.mkdir("/d")
    with pytest.raises(FileExistsError):
        volume.open("/d", "xb")
    with volume.open("/d/f", "xb") as f:
        f.write(b"data")
    with pytest.raises(OSError) as not_empty:
        volume.rmdir("/d")
    assert not_empty.value.errno == errno.ENOTEMPTY
    with pytest.raises(IsADirectoryError):
        volume.open("/d", "rb")
    with pytest.raises(NotADirectoryError):
        volume.mkdir("/d/f/sub")
    with volume.open("/d/f", "rb") as f:
        with pytest.raises(OSError) as not_writable:
            f.write(b"x")
        assert not_writable.value.errno == errno.EBADF
    with pytest.raises(ValueError):
        volume.open("/d/f", "rt")


def test_namespace_calls(volume):
    volume.makedirs("/a/b", exist_ok=True)
    volume.makedirs("/a/b", exist_ok=True)
    with pytest.raises(FileExistsError):
        volume.makedirs("/a/b")
    with volume.open("/a/b/f", "wb") as f:
        f.write(b"1")
    volume.rename("/a/b/f", "/a/g")
    assert volume.listdir("/a") == ["b", "g"]
    assert volume.exists("/a/g") and not volume.exists("/a/b/f")
    volume.remove("/a/g")
    volume.rmdir("/a/b")
    volume.rmdir("/a")
    assert volume.listdir() == []


def os_errno(call):
    """The errno `call` raises (OSError), or None when it returns."""
    try:
        call()
    except OSError as error:
        return error.errno
    return None


def test_link_symlink_readlink_chmod_as_os(volume, tmp_path):
    """Each call beside os's own on a host directory: the same results, the
    same errors."""
    host = str(tmp_path / "host")
    os.mkdir(host)

    def on_host(path):
        return host + path

    open(on_host("/f"), "wb").close()
    volume.open("/f", "wb").close()

    # link(src, dst): a second name of the same inode.
    volume.link("/f", "/g")
    os.link(on_host("/f"), on_host("/g"))
    assert volume.stat("/g").st_ino == volume.stat("/f").st_ino
    assert volume.stat("/f").st_nlink == 2 == os.stat(on_host("/g")).st_nlink
    with pytest.raises(FileNotFoundError) as missing:
        volume.link("/nope", "/h")
    assert (missing.value.filename, missing.value.filename2) == ("/nope", "/h")
    assert os_errno(lambda: volume.link("/f", "/g")) == errno.EEXIST
    assert os_errno(lambda: os.link(on_host("/f"), on_host("/g"))) == errno.EEXIST

    # symlink(src, dst): dst points at src, stored as given; readlink -> str.
    volume.symlink("f", "/s")
    os.symlink("f", on_host("/s"))
    assert volume.readlink("/s") == "f" == os.readlink(on_host("/s"))
    assert isinstance(volume.readlink("/s"), str)
    assert volume.stat("/s").st_ino == volume.stat("/f").st_ino
    assert sorted(volume.listdir()) == ["f", "g", "s"] == sorted(os.listdir(host))
    volume.symlink("/no/such/target", "/dangling")
    assert volume.readlink("/dangling") == "/no/such/target"
    with pytest.raises(FileExistsError) as exists:
        volume.symlink("f", "/s")
    assert (exists.value.filename, exists.value.filename2) == ("f", "/s")
    # readlink of what is not a symlink: EINVAL; of nothing: ENOENT.
    assert os_errno(lambda: volume.readlink("/f")) == errno.EINVAL
    assert os_errno(lambda: os.readlink(on_host("/f"))) == errno.EINVAL
    with pytest.raises(FileNotFoundError):
        volume.readlink("/nope")

    # chmod(path, mode): the permission bits, through a symlink to its target.
    volume.chmod("/f", 0o600)
    os.chmod(on_host("/f"), 0o600)
    assert stat.S_IMODE(volume.stat("/f").st_mode) == 0o600
    volume.chmod("/s", 0o4751)
    os.chmod(on_host("/s"), 0o4751)
    assert stat.S_IMODE(volume.stat("/f").st_mode) == 0o4751
    assert stat.S_IMODE(os.stat(on_host("/f")).st_mode) == 0o4751
    assert stat.S_ISLNK(os.lstat(on_host("/s")).st_mode)
    assert stat.S_ISREG(volume.stat("/g").st_mode)
    with pytest.raises(FileNotFoundError) as missing:
        volume.chmod("/nope", 0o644)
    assert missing.value.filename == "/nope"
    assert os_errno(lambda: volume.chmod("/dangling", 0o644)) == errno.ENOENT


def test_clone_file_shares_then_copies_on_write(volume):
    data = bytes(range(256)) * 1024
    with volume.open("/original", "wb") as f:
        f.write(data)
    volume.clone_file("/original", "/clone")
    with pytest.raises(FileExistsError):
        volume.clone_file("/original", "/clone")
    with volume.open("/clone", "r+b") as f:
        f.seek(4096)
        f.write(b"changed")
    with volume.open("/original", "rb") as f:
        assert f.read() == data
    with volume.open("/clone", "rb") as f:
        assert f.read() == data[:4096] + b"changed" + data[4096 + 7:]


def test_clone_tree_copies_the_tree_at_one_instant(volume):
    volume.makedirs("/tree/sub")
    with volume.open("/tree/sub/file", "wb") as f:
        f.write(b"tree data")
    assert volume.clone_tree("/tree", "/tree-snapshot") == (1, 0)
    with pytest.raises(FileExistsError):
        volume.clone_tree("/tree", "/tree-snapshot")
    with volume.open("/tree-snapshot/sub/file", "rb") as f:
        assert f.read() == b"tree data"


def test_volume_options_are_mount_options(tmp_path):
    image = str(tmp_path / "vol.img")
    foliofs.mkfs(image, 64 << 20, block_size=4096, options="engine=sync")
    with foliofs.Volume(image, "engine=threads,io_threads=2,cache_bytes=16M") as volume:
        with volume.open("/f", "wb") as f:
            f.write(b"x" * 10000)
    with foliofs.Volume(image, options="engine=sync,commit_interval_ms=0") as volume:
        assert volume.stat("/f").st_size == 10000
    # The library's messages, as ValueError.
    with pytest.raises(ValueError, match=r'unknown option "bogus"; supported: engine, '):
        foliofs.Volume(image, options="bogus=1")
    with pytest.raises(ValueError, match=r"option io_threads=0: must be between 1 and 256"):
        foliofs.Volume(image, options="io_threads=0")
    with pytest.raises(ValueError, match=r"option engine=fast: engine must be sync, threads or"):
        foliofs.mkfs(image, 64 << 20, options="engine=fast")
    # Refused before the image was touched.
    with foliofs.Volume(image) as volume:
        assert volume.listdir() == ["f"]


def test_mkfs_metadata_size_sets_how_many_files_fit(tmp_path):
    image = str(tmp_path / "vol.img")
    # 64 MiB volumes: the default 1 MiB of metadata room fills before
    # 20,000 empty files; 4 MiB holds them.
    foliofs.mkfs(image, 64 << 20)
    with foliofs.Volume(image) as volume:
        with pytest.raises(OSError) as refused:
            for index in range(20000):
                volume.open(f"/f{index}", "wb").close()
        assert refused.value.errno == errno.ENOSPC
    foliofs.mkfs(image, 64 << 20, journal_size=2 << 20, metadata_size=4 << 20)
    with foliofs.Volume(image) as volume:
        for index in range(20000):
            volume.open(f"/f{index}", "wb").close()
        assert len(volume.listdir()) == 20000
    # Refused with EINVAL, the message naming the field.
    with pytest.raises(OSError, match=r"metadata size: 1000 bytes is outside 1 MiB") as bad:
        foliofs.mkfs(image, 64 << 20, metadata_size=1000)
    assert bad.value.errno == errno.EINVAL


def test_read_only_volume_reads_and_refuses_changes(tmp_path):
    image = str(tmp_path / "vol.img")
    foliofs.mkfs(image, 64 << 20)
    with foliofs.Volume(image) as volume:
        volume.mkdir("/d")
        with volume.open("/d/f", "wb") as f:
            f.write(b"data")
    for volume in (foliofs.Volume(image, read_only=True), foliofs.Volume(image, "ro")):
        with volume:
            with volume.open("/d/f") as f:
                assert f.read() == b"data"
                assert f.stat().st_size == 4
            assert volume.listdir("/d") == ["f"]
            assert volume.exists("/d/f")
            changes = [
                lambda: volume.open("/d/f", "r+b"),
                lambda: volume.open("/d/f", "ab"),
                lambda: volume.open("/d/g", "wb"),
                lambda: volume.mkdir("/e"),
                lambda: volume.rename("/d/f", "/g"),
                lambda: volume.remove("/d/f"),
                lambda: volume.rmdir("/d"),
                lambda: volume.link("/d/f", "/d/g"),
                lambda: volume.symlink("f", "/d/g"),
                lambda: volume.chmod("/d/f", 0o600),
            ]
            for change in changes:
                with pytest.raises(OSError) as refused:
                    change()
                assert refused.value.errno == errno.EROFS, refused.value
    with foliofs.Volume(image) as volume:
        assert volume.listdir("/") == ["d"]
        with volume.open("/d/f") as f:
            assert f.read() == b"data"


def test_other_threads_run_while_one_waits_in_fsync(volume):
    """fsync releases the GIL. Thread B only wakes when the test thread A
    sets `go` right before each fsync, and answers with `done`. The switch
    interval is raised so far that the interpreter never takes the GIL from
    a thread by force: B, once woken, can run only where A gives the GIL up
    itself. Between setting `go` and reading `done` A makes one call, fsync:
    if fsync held the GIL throughout, `done` could never be set when A reads
    it; with the GIL released, B runs while A waits in fsync (at least once
    across the fsyncs: B must be scheduled within one)."""
    go, done, stop = threading.Event(), threading.Event(), threading.Event()

    def answer():
        while True:
            go.wait()
            go.clear()
            if stop.is_set():
                return
            done.set()

    chunks = [os.urandom(256 << 10), os.urandom(256 << 10)]
    answered, fsyncs = 0, 0
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    thread = threading.Thread(target=answer)
    try:
        thread.start()
        with volume.open("/f", "wb") as f:
            deadline = time.monotonic() + 30
            while answered < 3 and fsyncs < 300 and time.monotonic() < deadline:
                # Fresh dirty data for fsync to write back, in the same place.
                f.seek(0)
                f.write(chunks[fsyncs % 2])
                done.clear()
                go.set()
                f.fsync()
                answered += done.is_set()
                fsyncs += 1
    finally:
        stop.set()
        go.set()
        thread.join()
        sys.setswitchinterval(switch_interval)
    assert answered > 0, f"no other thread ran during any of {fsyncs} fsyncs"


def test_threads_share_volumes_and_files(volume):
    """Calls on one File from several threads are serialized (each waits
    for the other's call), calls on one Volume run side by side."""
    errors = []

    def work(index):
        try:
            volume.makedirs(f"/t{index}/sub")
            for _ in range(50):
                shared.write(bytes([index]) * 1000)
                volume.stat(f"/t{index}/sub")
            assert volume.listdir(f"/t{index}") == ["sub"]
        except Exception as error:  # reported below, from the test's thread
            errors.append(error)

    with volume.open("/shared", "ab") as shared:
        threads = [threading.Thread(target=work, args=(index,)) for index in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert errors == []
    with volume.open("/shared") as f:
        data = f.read()
    assert len(data) == 4 * 50 * 1000
    assert all(data.count(bytes([index])) == 50 * 1000 for index in range(4))
    # Bytes-like objects other than bytes are written too.
    with volume.open("/other", "w+b") as f:
        assert f.write(bytearray(b"ab")) == 2
        assert f.write(memoryview(b"cdef")[1:3]) == 2
        f.seek(0)
        assert f.read() == b"abde"
        with pytest.raises(TypeError):
            f.write("text")
