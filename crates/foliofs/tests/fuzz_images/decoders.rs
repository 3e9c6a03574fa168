//! The decoders of `format` fed mutated structure samples directly.

use super::*;

/// Runs every decoder over `bytes` at every offset that might hold a
/// structure (the sample's start, and each 512-byte sector).
pub(crate) fn decode_everything(bytes: &[u8], uuid: &[u8; 16]) -> u64 {
    let mut calls = 0u64;
    let mut at = 0;
    while at < bytes.len() {
        let here = &bytes[at..];
        let _ = Superblock::decode(here);
        if let Ok(header) = CheckpointHeader::decode(here, here.len() as u64) {
            let payload = &here[HEADER_BYTES.min(here.len())..];
            let payload = &payload[..(header.payload_bytes as usize).min(payload.len())];
            if header.check_payload(payload).is_ok() {
                let _ = decode_all(payload, header.record_count.min(u64::from(u32::MAX)) as u32);
            }
        }
        for uuid in [uuid, &[0u8; 16]] {
            if let Ok(header) = decode_group_header(here, uuid, here.len() as u64) {
                if let Ok(payload) = check_group_payload(here, &header, uuid) {
                    let _ = decode_all(payload, header.record_count);
                }
            }
        }
        let _ = decode_all(here, u32::MAX);
        let _ = decode_all(here, 1);
        calls += 7;
        at += 512;
    }
    calls
}

/// Mutates `sample` in place: raw changes and hostile lengths.
pub(crate) fn mutate_bytes(rng: &mut ChaCha8Rng, sample: &mut Vec<u8>, donor: &[u8]) -> String {
    if sample.is_empty() {
        sample.push(rng.random());
        return "grow".into();
    }
    let at = rng.random_range(0..sample.len());
    match rng.random_range(0..8) {
        0 => {
            sample[at] ^= 1 << rng.random_range(0..8);
            format!("flip at {at}")
        }
        1 => {
            sample[at] = rng.random();
            format!("set at {at}")
        }
        2 if sample.len() >= at + 4 => {
            sample[at..at + 4].copy_from_slice(&interesting_u32(rng).to_le_bytes());
            format!("u32 at {at}")
        }
        3 if sample.len() >= at + 8 => {
            sample[at..at + 8].copy_from_slice(&interesting_u64(rng, &[]).to_le_bytes());
            format!("u64 at {at}")
        }
        4 => {
            sample.truncate(at);
            format!("truncate to {at}")
        }
        5 if !donor.is_empty() => {
            let from = rng.random_range(0..donor.len());
            let length = rng.random_range(1..=64).min(donor.len() - from);
            let end = (at + length).min(sample.len());
            sample.splice(at..end, donor[from..from + length].iter().copied());
            format!("splice {length} at {at}")
        }
        _ => {
            let length = rng.random_range(1..64);
            sample.splice(at..at, std::iter::repeat_n(0xFF, length));
            format!("insert {length} x 0xff at {at}")
        }
    }
}

/// Re-frames a mutated header so the checksum passes: the decoders' field
/// checks, not the crc, get the hostile values.
pub(crate) fn reseal_headers(sample: &mut [u8], uuid: &[u8; 16]) {
    if sample.len() < HEADER_BYTES {
        return;
    }
    if &sample[..8] == b"FOLIOFS\0" || &sample[..8] == b"FOLIOCKP" {
        let crc = foliofs::format::codec::crc_with_hole(&sample[..HEADER_BYTES], HEADER_BYTES - 4);
        sample[HEADER_BYTES - 4..HEADER_BYTES].copy_from_slice(&crc.to_le_bytes());
    }
    if &sample[..8] == b"FOLIOJNL" {
        let crc = crc32c::crc32c_append(crc32c::crc32c(uuid), &sample[..60]);
        sample[60..64].copy_from_slice(&crc.to_le_bytes());
    }
}

#[test]
pub(crate) fn decoders_survive_mutated_corpus_samples() {
    let samples = load_samples();
    assert!(samples.len() >= 9, "the corpus has samples of each structure: {}", samples.len());
    let budget = Budget::new(100_000, 8);
    let mut rng = ChaCha8Rng::seed_from_u64(base_seed());
    let mut executions = 0u64;
    let mut calls = 0u64;
    while budget.allows(executions) {
        let (name, sample) = &samples[rng.random_range(0..samples.len())];
        let (uuid, body) = if name.ends_with(".group") && sample.len() >= 16 {
            (<[u8; 16]>::try_from(&sample[..16]).unwrap(), &sample[16..])
        } else {
            ([0u8; 16], &sample[..])
        };
        let donor = &samples[rng.random_range(0..samples.len())].1;
        let mut mutated = body.to_vec();
        for _ in 0..rng.random_range(1..=4) {
            mutate_bytes(&mut rng, &mut mutated, donor);
        }
        if rng.random_bool(0.5) {
            reseal_headers(&mut mutated, &uuid);
        }
        calls += decode_everything(&mutated, &uuid);
        executions += 1;
    }
    eprintln!("decoder fuzz: {executions} executions, {calls} decoder calls");
}

// ---------------------------------------------------------------------------
