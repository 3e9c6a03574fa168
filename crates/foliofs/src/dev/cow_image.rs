//! A device image in chunks shared between copies until one writes them:
//! cloning costs a reference per 64 KiB, and a write copies only the chunks
//! it touches. The crash checker builds an image per crash point and opens
//! several devices on each; as flat byte vectors, copying them was most of
//! its time.

use std::sync::Arc;

const CHUNK_BYTES: usize = 64 << 10;

#[derive(Clone)]
pub struct CowImage {
    chunks: Vec<Arc<Vec<u8>>>,
    len: usize,
}

impl CowImage {
    pub fn from_bytes(bytes: &[u8]) -> Self {
        let chunks = bytes.chunks(CHUNK_BYTES).map(|chunk| Arc::new(chunk.to_vec())).collect();
        Self { chunks, len: bytes.len() }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn to_vec(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(self.len);
        for chunk in &self.chunks {
            bytes.extend_from_slice(chunk);
        }
        bytes
    }

    /// The chunks `[offset, offset + length)` covers, with the range inside
    /// each: `(chunk index, start in chunk, bytes, start in the range)`.
    fn pieces(offset: usize, length: usize) -> impl Iterator<Item = (usize, usize, usize, usize)> {
        let mut done = 0;
        std::iter::from_fn(move || {
            if done >= length {
                return None;
            }
            let at = offset + done;
            let start = at % CHUNK_BYTES;
            let bytes = (CHUNK_BYTES - start).min(length - done);
            let piece = (at / CHUNK_BYTES, start, bytes, done);
            done += bytes;
            Some(piece)
        })
    }

    /// Copies `[offset, offset + out.len())` into `out` (the caller checks
    /// the range lies inside the image).
    pub fn read(&self, offset: usize, out: &mut [u8]) {
        assert!(offset + out.len() <= self.len, "read past the end of the image");
        for (chunk, start, bytes, done) in Self::pieces(offset, out.len()) {
            out[done..done + bytes].copy_from_slice(&self.chunks[chunk][start..start + bytes]);
        }
    }

    /// Writes `data` at `offset`, copying each shared chunk it touches.
    pub fn write(&mut self, offset: usize, data: &[u8]) {
        assert!(offset + data.len() <= self.len, "write past the end of the image");
        for (chunk, start, bytes, done) in Self::pieces(offset, data.len()) {
            let chunk: &mut Vec<u8> = Arc::make_mut(&mut self.chunks[chunk]);
            chunk[start..start + bytes].copy_from_slice(&data[done..done + bytes]);
        }
    }

    /// Whether both hold the same chunks (no copy made since one was
    /// cloned from the other).
    pub fn shares_all_chunks_with(&self, other: &CowImage) -> bool {
        self.chunks.len() == other.chunks.len()
            && self.chunks.iter().zip(&other.chunks).all(|(a, b)| Arc::ptr_eq(a, b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_share_chunks_until_written() {
        let bytes: Vec<u8> = (0..3 * CHUNK_BYTES + 512).map(|index| index as u8).collect();
        let image = CowImage::from_bytes(&bytes);
        assert_eq!((image.len(), image.to_vec()), (bytes.len(), bytes.clone()));
        let mut copy = image.clone();
        assert!(copy.shares_all_chunks_with(&image));
        // Across the first chunk boundary, and into the short last chunk.
        copy.write(CHUNK_BYTES - 100, &[0xEE; 200]);
        copy.write(3 * CHUNK_BYTES + 500, &[0xDD; 12]);
        let mut expected = bytes.clone();
        expected[CHUNK_BYTES - 100..CHUNK_BYTES + 100].fill(0xEE);
        expected[3 * CHUNK_BYTES + 500..].fill(0xDD);
        assert!(copy.to_vec() == expected);
        assert!(image.to_vec() == bytes, "the original is untouched");
        assert!(Arc::ptr_eq(&copy.chunks[2], &image.chunks[2]), "untouched chunks are shared");
        assert!(!Arc::ptr_eq(&copy.chunks[1], &image.chunks[1]));
        let mut read = vec![0; CHUNK_BYTES + 300];
        copy.read(CHUNK_BYTES - 200, &mut read);
        assert!(read[..] == expected[CHUNK_BYTES - 200..2 * CHUNK_BYTES + 100]);
    }
}
