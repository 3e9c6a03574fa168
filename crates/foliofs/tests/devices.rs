//! The three engines through `Device`: data round trips, FUA accounting,
//! alignment errors, and hundreds of asynchronous requests in flight.

use std::io::{IoSlice, IoSliceMut};
use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::Arc;

use foliofs::dev::{AlignedBuf, DevOptions, DevRequest, Device, EngineKind, FuaMode};

const ENGINES: [EngineKind; 3] = [EngineKind::Sync, EngineKind::Threads, EngineKind::Uring];
const IMAGE_BYTES: u64 = 8 << 20;

/// A fresh image file under the target directory (a real disk, so O_DIRECT works).
fn image() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = dir.path().join("dev.img");
    std::fs::File::create(&path).unwrap().set_len(IMAGE_BYTES).unwrap();
    (dir, path)
}

fn open(path: &std::path::Path, engine: EngineKind, fua: FuaMode) -> Device {
    let options = DevOptions { engine, fua, ..DevOptions::default() };
    Device::open(path, &options).unwrap_or_else(|error| panic!("open with {engine:?}: {error}"))
}

fn block(seed: u8) -> AlignedBuf {
    let mut buffer = AlignedBuf::zeroed(4096);
    for (index, byte) in buffer.iter_mut().enumerate() {
        *byte = seed.wrapping_mul(31).wrapping_add(index as u8);
    }
    buffer
}

#[test]
fn vectored_round_trip_on_every_engine() {
    for engine in ENGINES {
        let (_dir, path) = image();
        let device = open(&path, engine, FuaMode::Native);
        assert_eq!(device.size_bytes(), IMAGE_BYTES);
        assert!(device.logical_block_bytes() >= 512);
        let (first, second) = (block(1), block(2));
        device.write_vectored(8192, &[IoSlice::new(&first), IoSlice::new(&second)], false).unwrap();
        let mut read_first = AlignedBuf::zeroed(4096);
        let mut read_second = AlignedBuf::zeroed(4096);
        device
            .read_vectored(
                8192,
                &mut [IoSliceMut::new(&mut read_first), IoSliceMut::new(&mut read_second)],
            )
            .unwrap();
        assert_eq!((&read_first[..], &read_second[..]), (&first[..], &second[..]), "{engine:?}");
        let stats = device.stats();
        assert_eq!((stats.write_requests, stats.read_requests), (1, 1));
        assert_eq!((stats.bytes_written, stats.bytes_read), (8192, 8192));
        drop(device);
        let reopened = open(&path, engine, FuaMode::Native);
        let mut again = AlignedBuf::zeroed(4096);
        reopened.read(12288, &mut again).unwrap();
        assert_eq!(&again[..], &second[..], "{engine:?}: data reached the file");
    }
}

#[test]
fn fua_is_one_request_native_and_write_plus_flush_emulated() {
    for engine in ENGINES {
        let (_dir, path) = image();
        let native = open(&path, engine, FuaMode::Native);
        native.write(0, &block(3), true).unwrap();
        let stats = native.stats();
        assert_eq!(
            (stats.write_requests, stats.fua_writes, stats.flush_requests),
            (1, 1, 0),
            "{engine:?}"
        );
        drop(native);
        let emulated = open(&path, engine, FuaMode::Emulate);
        emulated.write(0, &block(4), true).unwrap();
        let stats = emulated.stats();
        assert_eq!(
            (stats.write_requests, stats.fua_writes, stats.flush_requests),
            (1, 0, 1),
            "{engine:?}"
        );
        assert_eq!(stats.requests(), 2);
    }
}

#[test]
fn misaligned_and_out_of_range_requests_are_refused() {
    for engine in ENGINES {
        let (_dir, path) = image();
        let device = open(&path, engine, FuaMode::Native);
        let buffer = AlignedBuf::zeroed(4096);
        for (offset, length) in
            [(100u64, 4096usize), (0, 100), (IMAGE_BYTES, 4096), (IMAGE_BYTES - 512, 4096)]
        {
            let error = device.write(offset, &buffer[..length], false).unwrap_err();
            assert_eq!(
                error.kind(),
                std::io::ErrorKind::InvalidInput,
                "{engine:?} {offset}+{length}"
            );
        }
        assert_eq!(device.stats().requests(), 0, "refused requests never reach the device");
    }
}

#[test]
fn hundreds_of_async_requests_in_flight_from_several_threads() {
    for engine in ENGINES {
        let (_dir, path) = image();
        let device = Arc::new(open(&path, engine, FuaMode::Native));
        let (sender, receiver) = mpsc::channel();
        let submitters: Vec<_> = (0..4u64)
            .map(|thread| {
                let device = Arc::clone(&device);
                let sender = sender.clone();
                std::thread::spawn(move || {
                    for index in 0..128u64 {
                        let slot = thread * 128 + index;
                        let request = DevRequest::Write {
                            offset: slot * 4096,
                            buffer: block(slot as u8),
                            fua: false,
                        };
                        let sender = sender.clone();
                        device.submit(
                            request,
                            Box::new(move |response| sender.send(response.result.is_ok()).unwrap()),
                        );
                    }
                })
            })
            .collect();
        for submitter in submitters {
            submitter.join().unwrap();
        }
        let succeeded = (0..512).map(|_| receiver.recv().unwrap()).filter(|ok| *ok).count();
        assert_eq!(succeeded, 512, "{engine:?}");
        let (flushed_sender, flushed) = mpsc::channel();
        device.submit(
            DevRequest::Flush,
            Box::new(move |response| flushed_sender.send(response.result.is_ok()).unwrap()),
        );
        assert!(flushed.recv().unwrap());
        for slot in 0..512u64 {
            let (read_sender, read) = mpsc::channel();
            let request =
                DevRequest::Read { offset: slot * 4096, buffer: AlignedBuf::zeroed(4096) };
            device.submit(request, Box::new(move |response| read_sender.send(response).unwrap()));
            let response = read.recv().unwrap();
            response.result.unwrap();
            assert_eq!(
                &response.buffer.unwrap()[..],
                &block(slot as u8)[..],
                "{engine:?} slot {slot}"
            );
        }
        let stats = device.stats();
        assert_eq!(
            (stats.write_requests, stats.flush_requests, stats.read_requests),
            (512, 1, 512)
        );
    }
}

#[test]
fn async_fua_counts_like_blocking_fua() {
    for engine in ENGINES {
        for (mode, expected) in [(FuaMode::Native, (1, 1, 0)), (FuaMode::Emulate, (1, 0, 1))] {
            let (_dir, path) = image();
            let device = open(&path, engine, mode);
            let (sender, receiver) = mpsc::channel();
            let request = DevRequest::Write { offset: 4096, buffer: block(9), fua: true };
            device.submit(
                request,
                Box::new(move |response| sender.send(response.result.is_ok()).unwrap()),
            );
            assert!(receiver.recv().unwrap());
            let stats = device.stats();
            assert_eq!(
                (stats.write_requests, stats.fua_writes, stats.flush_requests),
                expected,
                "{engine:?} {mode:?}"
            );
        }
    }
}
