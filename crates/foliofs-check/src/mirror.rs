//! The fault device's write log kept beside a real device: every request
//! goes to the real device (an NBD export, say) and, once that answered,
//! is recorded by an in-memory [`FaultDev`], so crash images are cut from
//! the log as on the in-memory device while the engine's reads, writes and
//! flushes all cross the real one.

use std::io::{self, IoSlice, IoSliceMut};
use std::sync::Arc;

use foliofs::dev::{DevCallback, DevRequest, DevResponse, DiscardMode, FaultDev, RawDev};

pub struct MirrorDev {
    real: Arc<dyn RawDev>,
    log: Arc<FaultDev>,
}

impl MirrorDev {
    /// Writes `log`'s whole image onto `real` and flushes it, so both start
    /// alike (the garbage the in-memory devices start with included).
    pub fn new(real: Arc<dyn RawDev>, log: Arc<FaultDev>) -> io::Result<Self> {
        let size_bytes = log.size_bytes();
        if real.size_bytes() < size_bytes {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("the real device has {} bytes, {size_bytes} needed", real.size_bytes()),
            ));
        }
        let image = log.image();
        for (index, chunk) in image.chunks(1 << 20).enumerate() {
            real.write_at((index as u64) << 20, &[IoSlice::new(chunk)], false)?;
        }
        real.flush()?;
        Ok(Self { real, log })
    }

    /// The first byte offset where the real device differs from the log's
    /// image; None when they are the same.
    pub fn first_difference(&self) -> io::Result<Option<u64>> {
        let image = self.log.image();
        let mut buffer = vec![0u8; 1 << 20];
        for (index, chunk) in image.chunks(buffer.len()).enumerate() {
            let read = &mut buffer[..chunk.len()];
            let offset = (index as u64) << 20;
            self.real.read_at(offset, &mut [IoSliceMut::new(read)])?;
            if let Some(at) = read.iter().zip(chunk).position(|(a, b)| a != b) {
                return Ok(Some(offset + at as u64));
            }
        }
        Ok(None)
    }
}

impl RawDev for MirrorDev {
    fn read_at(&self, offset: u64, buffers: &mut [IoSliceMut<'_>]) -> io::Result<()> {
        self.real.read_at(offset, buffers)
    }

    fn write_at(&self, offset: u64, buffers: &[IoSlice<'_>], fua: bool) -> io::Result<()> {
        self.real.write_at(offset, buffers, fua)?;
        self.log.write_at(offset, buffers, fua)
    }

    fn flush(&self) -> io::Result<()> {
        self.real.flush()?;
        self.log.flush()
    }

    fn submit(&self, request: DevRequest, done: DevCallback) {
        // Recorded when the real device answers, as the log's order is the
        // order requests completed in (a flush covers what completed before
        // it was issued).
        let log = self.log.clone();
        let record: Option<(u64, bool)> = match &request {
            DevRequest::Write { offset, fua, .. } => Some((*offset, *fua)),
            _ => None,
        };
        let is_flush = matches!(request, DevRequest::Flush);
        self.real.submit(
            request,
            Box::new(move |mut response: DevResponse| {
                if response.result.is_ok() {
                    if let (Some((offset, fua)), Some(buffer)) = (record, &response.buffer) {
                        response.result = log.write_at(offset, &[IoSlice::new(buffer)], fua);
                    } else if is_flush {
                        response.result = log.flush();
                    }
                }
                done(response)
            }),
        );
    }

    fn unplug(&self) {
        self.real.unplug()
    }

    fn discard(&self, offset: u64, length: u64, mode: DiscardMode) -> io::Result<()> {
        self.real.discard(offset, length, mode)?;
        self.log.discard(offset, length, mode)
    }

    fn size_bytes(&self) -> u64 {
        self.log.size_bytes()
    }

    fn logical_block_bytes(&self) -> u32 {
        self.log.logical_block_bytes().max(self.real.logical_block_bytes())
    }
}
