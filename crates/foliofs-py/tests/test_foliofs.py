"""The foliofs Python module as a Python user sees it: file objects,
os.stat-like results, OSError with the errno. Run by scripts/python-tests.sh."""

import errno
import io
import os
import stat

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
