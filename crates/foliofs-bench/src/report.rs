//! Reports: fio's human output (per job: IOPS, bandwidth, latency and its
//! percentiles) and fio's JSON shape (`jobs[].read|write` with io_bytes, bw,
//! iops, runtime, clat_ns/lat_ns and their percentiles), so tools that read
//! fio's JSON read ours. The device counters are added to both.

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Map, Value};

use crate::latency::Latencies;
use crate::runner::{JobReport, RunReport, SideStats};

/// The percentiles fio reports by default.
pub const PERCENTILES: &[f64] = &[
    1.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95,
    99.99,
];

fn iops(side: &SideStats, job: &JobReport) -> f64 {
    side.ios as f64 / job.runtime.as_secs_f64().max(1e-9)
}

fn bandwidth_bytes(side: &SideStats, job: &JobReport) -> f64 {
    side.io_bytes as f64 / job.runtime.as_secs_f64().max(1e-9)
}

fn latency_json(latencies: &Latencies) -> Value {
    let mut percentiles = Map::new();
    for &percentile in PERCENTILES {
        percentiles.insert(format!("{percentile:.6}"), json!(latencies.percentile_ns(percentile)));
    }
    json!({
        "min": latencies.min_ns(),
        "max": latencies.max_ns(),
        "mean": latencies.mean_ns(),
        "stddev": latencies.stdev_ns(),
        "N": latencies.count(),
        "percentile": percentiles,
    })
}

fn side_json(side: &SideStats, job: &JobReport) -> Value {
    let bandwidth = bandwidth_bytes(side, job);
    json!({
        "io_bytes": side.io_bytes,
        "io_kbytes": side.io_bytes / 1024,
        "bw_bytes": bandwidth.round() as u64,
        "bw": (bandwidth / 1024.0).round() as u64,
        "iops": iops(side, job),
        "runtime": job.runtime.as_millis() as u64,
        "total_ios": side.ios,
        "short_ios": 0,
        "drop_ios": 0,
        // Requests are submitted in-process: submission latency is part of
        // the completion latency, and lat equals clat.
        "slat_ns": {"min": 0, "max": 0, "mean": 0.0, "stddev": 0.0, "N": 0},
        "clat_ns": latency_json(&side.latencies),
        "lat_ns": latency_json(&side.latencies),
    })
}

/// fio's JSON output, with a `foliofs` section for the device counters and
/// the volume options.
pub fn to_json(report: &RunReport, volume_options: &str) -> Value {
    let timestamp = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_secs());
    let jobs: Vec<Value> = report
        .jobs
        .iter()
        .enumerate()
        .map(|(groupid, job)| {
            json!({
                "jobname": job.name,
                "groupid": groupid,
                "error": 0,
                "jobs": job.instances,
                "job_runtime": job.runtime.as_millis() as u64,
                "read": side_json(&job.read, job),
                "write": side_json(&job.write, job),
                "trim": side_json(&SideStats::empty(), job),
                "verified_blocks": job.verified_blocks,
                "notes": job.notes,
            })
        })
        .collect();
    let device = &report.device;
    let user_bytes_written: u64 = report.jobs.iter().map(|job| job.write.io_bytes).sum();
    json!({
        "fio version": concat!("foliofs-bench-", env!("CARGO_PKG_VERSION")),
        "timestamp": timestamp,
        "jobs": jobs,
        "foliofs": {
            "volume_options": volume_options,
            "device": {
                "read_requests": device.read_requests,
                "write_requests": device.write_requests,
                "flush_requests": device.flush_requests,
                "fua_writes": device.fua_writes,
                "bytes_read": device.bytes_read,
                "bytes_written": device.bytes_written,
                "write_amplification": if user_bytes_written > 0 {
                    device.bytes_written as f64 / user_bytes_written as f64
                } else {
                    0.0
                },
            },
        },
    })
}

/// Human units as fio prints them: `801k`, `1565MiB/s`.
fn short_count(value: f64) -> String {
    if value >= 1e6 {
        format!("{:.1}M", value / 1e6)
    } else if value >= 1e4 {
        format!("{:.0}k", value / 1e3)
    } else {
        format!("{value:.0}")
    }
}

fn short_rate(bytes_per_second: f64) -> String {
    let mib = bytes_per_second / (1 << 20) as f64;
    if mib >= 1.0 {
        format!("{mib:.0}MiB/s")
    } else {
        format!("{:.0}KiB/s", bytes_per_second / 1024.0)
    }
}

/// fio's human output.
pub fn to_text(report: &RunReport) -> String {
    let mut out = String::new();
    for (groupid, job) in report.jobs.iter().enumerate() {
        let _ = writeln!(out, "{}: (groupid={groupid}, jobs={}): err= 0", job.name, job.instances);
        for note in &job.notes {
            let _ = writeln!(out, "  note: {note}");
        }
        for (direction, side) in [("read", &job.read), ("write", &job.write)] {
            if side.ios == 0 {
                continue;
            }
            let _ = writeln!(
                out,
                "  {direction}: IOPS={}, BW={} ({} in {:.1}s, {} ios)",
                short_count(iops(side, job)),
                short_rate(bandwidth_bytes(side, job)),
                short_bytes(side.io_bytes),
                job.runtime.as_secs_f64(),
                side.ios
            );
            let latencies = &side.latencies;
            let _ = writeln!(
                out,
                "    clat (usec): min={:.1}, max={:.1}, avg={:.2}, stdev={:.2}",
                latencies.min_ns() as f64 / 1e3,
                latencies.max_ns() as f64 / 1e3,
                latencies.mean_ns() / 1e3,
                latencies.stdev_ns() / 1e3
            );
            let _ = writeln!(out, "    clat percentiles (usec):");
            for row in PERCENTILES.chunks(4) {
                let cells: Vec<String> = row
                    .iter()
                    .map(|&p| {
                        format!("{p:5.2}th=[{:>7.1}]", latencies.percentile_ns(p) as f64 / 1e3)
                    })
                    .collect();
                let _ = writeln!(out, "     | {}", cells.join(", "));
            }
        }
        if job.verified_blocks > 0 {
            let _ = writeln!(out, "  verify: {} blocks read back, crc32c ok", job.verified_blocks);
        }
    }
    let device = &report.device;
    let user_bytes: u64 = report.jobs.iter().map(|job| job.write.io_bytes).sum();
    let _ = writeln!(
        out,
        "\nDevice: requests read={} write={} flush={} fua={}, bytes read={} written={}{}",
        device.read_requests,
        device.write_requests,
        device.flush_requests,
        device.fua_writes,
        short_bytes(device.bytes_read),
        short_bytes(device.bytes_written),
        if user_bytes > 0 {
            format!(", write amplification={:.2}", device.bytes_written as f64 / user_bytes as f64)
        } else {
            String::new()
        }
    );
    out
}

fn short_bytes(bytes: u64) -> String {
    match bytes {
        bytes if bytes >= 1 << 30 => format!("{:.2}GiB", bytes as f64 / (1u64 << 30) as f64),
        bytes if bytes >= 1 << 20 => format!("{:.1}MiB", bytes as f64 / (1u64 << 20) as f64),
        bytes => format!("{:.1}KiB", bytes as f64 / 1024.0),
    }
}
