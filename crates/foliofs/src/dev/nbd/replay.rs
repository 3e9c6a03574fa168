//! What the client must be able to send again after a server restart: the
//! writes, zeroings and trims the server acknowledged since the last
//! FLUSH that covered them completed.
//!
//! An NBD server may acknowledge a write from a volatile cache; only a
//! completed FLUSH (or the write's own FUA) makes it durable. A server
//! that restarts loses that cache, and a FLUSH on the new connection
//! would report success over the loss. So the client keeps every
//! acknowledged change until a FLUSH covering it completes, and replays
//! what it kept before any other request after a reconnect.
//!
//! The log holds each byte's newest acknowledged change only: a later
//! change over the same range replaces the older one (so replay order
//! does not matter), and a FUA write releases the range it covered.

use std::collections::BTreeMap;
use std::sync::Arc;

/// What a kept range is to become again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum KeptChange {
    /// Written data: `data[start..start + length]`.
    Data {
        data: Arc<[u8]>,
        start: usize,
    },
    Zeroes,
    Trim,
}

#[derive(Debug)]
struct Kept {
    end: u64,
    change: KeptChange,
    /// When the server acknowledged it: a FLUSH covers what was
    /// acknowledged before it was sent.
    sequence: u64,
}

/// One range to send again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ReplayPiece {
    pub offset: u64,
    pub length: u64,
    pub change: KeptChange,
}

impl ReplayPiece {
    /// The bytes a replayed write sends.
    pub fn data(&self) -> Option<&[u8]> {
        match &self.change {
            KeptChange::Data { data, start } => Some(&data[*start..*start + self.length as usize]),
            KeptChange::Zeroes | KeptChange::Trim => None,
        }
    }
}

/// The acknowledged, not yet flushed changes, by offset; ranges never
/// overlap.
#[derive(Debug, Default)]
pub(super) struct ReplayLog {
    kept: BTreeMap<u64, Kept>,
    /// Bytes of written data held (zeroings and trims hold none).
    data_bytes: u64,
    data_bytes_peak: u64,
    /// The sequence number of the newest acknowledgement recorded.
    sequence: u64,
}

impl ReplayLog {
    /// Records an acknowledged change of `length` bytes at `offset`; it
    /// replaces whatever older change the range held.
    pub fn record(&mut self, offset: u64, length: u64, change: KeptChange) {
        if length == 0 {
            return;
        }
        self.release_range(offset, length);
        self.sequence += 1;
        if matches!(change, KeptChange::Data { .. }) {
            self.data_bytes += length;
            self.data_bytes_peak = self.data_bytes_peak.max(self.data_bytes);
        }
        self.kept.insert(offset, Kept { end: offset + length, change, sequence: self.sequence });
        debug_assert!(
            self.kept.range(..offset).next_back().is_none_or(|(_, before)| before.end <= offset)
                && self.kept.range(offset + 1..offset + length).next().is_none(),
            "kept ranges overlap after recording {length} bytes at {offset}"
        );
    }

    /// Forgets what a FUA write made durable: `length` bytes at `offset`.
    pub fn release_range(&mut self, offset: u64, length: u64) {
        let end = offset + length;
        let first = self.kept.range(..offset).next_back().filter(|(_, kept)| kept.end > offset);
        let mut overlapping: Vec<u64> = first.map(|(start, _)| *start).into_iter().collect();
        overlapping.extend(self.kept.range(offset..end).map(|(start, _)| *start));
        for start in overlapping {
            let kept = self.kept.remove(&start).expect("listed");
            if matches!(kept.change, KeptChange::Data { .. }) {
                self.data_bytes -= kept.end - start;
            }
            // What sticks out on either side stays, copied so the memory
            // held is what is kept.
            if start < offset {
                self.keep_part(start, offset, start, &kept);
            }
            if kept.end > end {
                self.keep_part(end, kept.end, start, &kept);
            }
        }
    }

    fn keep_part(&mut self, from: u64, to: u64, kept_start: u64, kept: &Kept) {
        let change = match &kept.change {
            KeptChange::Data { data, start } => {
                let skip = start + (from - kept_start) as usize;
                let data: Arc<[u8]> = Arc::from(&data[skip..skip + (to - from) as usize]);
                self.data_bytes += to - from;
                KeptChange::Data { data, start: 0 }
            }
            other => other.clone(),
        };
        self.kept.insert(from, Kept { end: to, change, sequence: kept.sequence });
    }

    /// The sequence number a FLUSH sent now covers.
    pub fn sequence(&self) -> u64 {
        self.sequence
    }

    /// A FLUSH sent when the sequence was `sequence` completed: everything
    /// acknowledged before it is durable.
    pub fn release_through(&mut self, sequence: u64) {
        let mut released = 0;
        self.kept.retain(|start, kept| {
            let keep = kept.sequence > sequence;
            if !keep && matches!(kept.change, KeptChange::Data { .. }) {
                released += kept.end - start;
            }
            keep
        });
        debug_assert!(released <= self.data_bytes, "released more data than was kept");
        self.data_bytes -= released;
    }

    pub fn data_bytes(&self) -> u64 {
        self.data_bytes
    }

    pub fn data_bytes_peak(&self) -> u64 {
        self.data_bytes_peak
    }

    /// Whether any kept change touches `length` bytes at `offset`.
    pub fn touches(&self, offset: u64, length: u64) -> bool {
        let end = offset + length;
        self.kept.range(..end).next_back().is_some_and(|(_, kept)| kept.end > offset)
            || self.kept.range(offset..end).next().is_some()
    }

    /// What to send again, leaving out `busy` ranges (`(offset, length)`):
    /// requests still in flight that will be sent anyway, and are newer.
    pub fn pieces_outside(&self, busy: &[(u64, u64)]) -> Vec<ReplayPiece> {
        let mut busy: Vec<(u64, u64)> =
            busy.iter().map(|(at, length)| (*at, at + length)).collect();
        busy.sort_unstable();
        let mut pieces = Vec::new();
        for (start, kept) in &self.kept {
            let mut from = *start;
            for (busy_start, busy_end) in &busy {
                if *busy_end <= from || *busy_start >= kept.end {
                    continue;
                }
                if *busy_start > from {
                    pieces.push(piece(*start, kept, from, *busy_start));
                }
                from = from.max(*busy_end);
                if from >= kept.end {
                    break;
                }
            }
            if from < kept.end {
                pieces.push(piece(*start, kept, from, kept.end));
            }
        }
        pieces
    }
}

fn piece(kept_start: u64, kept: &Kept, from: u64, to: u64) -> ReplayPiece {
    let change = match &kept.change {
        KeptChange::Data { data, start } => {
            KeptChange::Data { data: Arc::clone(data), start: start + (from - kept_start) as usize }
        }
        other => other.clone(),
    };
    ReplayPiece { offset: from, length: to - from, change }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(byte: u8, length: usize) -> KeptChange {
        KeptChange::Data { data: Arc::from(vec![byte; length]), start: 0 }
    }

    /// The bytes replaying `log` would leave at 0..size over `base`.
    fn replayed(log: &ReplayLog, busy: &[(u64, u64)], size: usize, base: u8) -> Vec<u8> {
        let mut image = vec![base; size];
        for piece in log.pieces_outside(busy) {
            let range = piece.offset as usize..(piece.offset + piece.length) as usize;
            match piece.data() {
                Some(bytes) => image[range].copy_from_slice(bytes),
                None => image[range].fill(0),
            }
        }
        image
    }

    #[test]
    fn a_newer_change_replaces_the_older_bytes_it_covers() {
        let mut log = ReplayLog::default();
        log.record(0, 8, data(1, 8));
        log.record(2, 4, data(2, 4));
        log.record(6, 4, KeptChange::Zeroes);
        assert_eq!(replayed(&log, &[], 12, 9), [1, 1, 2, 2, 2, 2, 0, 0, 0, 0, 9, 9]);
        assert_eq!(log.data_bytes(), 6, "two bytes of the first write and four of the second");
        assert_eq!(log.data_bytes_peak(), 8, "the newer write replaced bytes, not added them");
    }

    #[test]
    fn a_fua_write_releases_its_range_and_a_flush_what_came_before_it() {
        let mut log = ReplayLog::default();
        log.record(0, 8, data(1, 8));
        log.release_range(2, 2);
        assert_eq!(replayed(&log, &[], 8, 9), [1, 1, 9, 9, 1, 1, 1, 1]);
        let covered = log.sequence();
        log.record(16, 4, KeptChange::Trim);
        log.release_through(covered);
        assert_eq!(log.data_bytes(), 0);
        assert!(!log.touches(0, 16));
        assert!(log.touches(18, 1), "acknowledged after the flush was sent");
        assert_eq!(log.pieces_outside(&[]).len(), 1);
    }

    #[test]
    fn ranges_in_flight_are_left_to_their_own_requests() {
        let mut log = ReplayLog::default();
        log.record(0, 10, data(1, 10));
        let image = replayed(&log, &[(2, 2), (6, 1), (100, 5)], 10, 9);
        assert_eq!(image, [1, 1, 9, 9, 1, 1, 9, 1, 1, 1]);
        assert_eq!(replayed(&log, &[(0, 10)], 10, 9), [9; 10]);
    }
}
