//! The figures each seed's post reported, quoted beside the ones measured
//! here. A post compares an old kernel (or QEMU) with a new one on its own
//! machine; this run compares the engine's old policy with its new one on
//! the same fio shape. Machines differ, so what can be compared is the gain,
//! new over old, and the tables and charts put the two gains side by side.

use crate::results::{format_number, Group, Metric};

/// One figure of a post: what was measured and the value in its unit.
#[derive(Debug, Clone, Copy)]
pub struct Figure {
    pub label: &'static str,
    pub value: f64,
}

/// An old/new pair from a seed's post, and the rows of this run that play
/// the old and the new part on the same shape.
#[derive(Debug, Clone, Copy)]
pub struct Posted {
    /// The group (shape) of this run it belongs to, by name.
    pub group: &'static str,
    /// Where and how the post measured it.
    pub setting: &'static str,
    /// The unit of the post's figures.
    pub unit: &'static str,
    pub old: Figure,
    pub new: Figure,
    /// This run's row labels in the old and the new policy.
    pub measured_old: &'static str,
    pub measured_new: &'static str,
}

impl Posted {
    /// The post's gain, new over old.
    pub fn posted_gain(&self) -> f64 {
        self.new.value / self.old.value
    }

    /// This run's gain on the same shape, new over old, in the seed's
    /// metric; None when a row is missing or measured nothing.
    pub fn measured_gain(&self, group: &Group, metric: Metric) -> Option<f64> {
        let value = |label: &str| {
            group.rows.iter().find(|row| row.label == label).map(|row| metric.of(row))
        };
        let old = value(self.measured_old)?;
        let new = value(self.measured_new)?;
        (old > 0.0).then(|| new / old)
    }

    /// One line for a table or chart: the post's pair and gain, then this
    /// run's gain where it has one.
    pub fn summary(&self, group: &Group, metric: Metric) -> String {
        let mut line = format!(
            "posted ({}): {} {} -> {} {} {}, {:.2}x",
            self.setting,
            self.old.label,
            format_number(self.old.value),
            self.new.label,
            format_number(self.new.value),
            self.unit,
            self.posted_gain()
        );
        if let Some(gain) = self.measured_gain(group, metric) {
            line.push_str(&format!(
                "; here {} -> {}: {gain:.2}x",
                self.measured_old, self.measured_new
            ));
        }
        line
    }
}

/// The short line a chart prints under a cluster: the post's gain (each
/// with its setting where the post gives several for one shape) and this
/// run's; None when the seed quotes nothing for the shape.
pub fn chart_note(id: &str, group: &Group, metric: Metric) -> Option<String> {
    let pairs: Vec<&Posted> = for_group(id, group).collect();
    let first = pairs.first()?;
    let posted: Vec<String> = if pairs.len() == 1 {
        vec![format!("{:.2}x", first.posted_gain())]
    } else {
        pairs.iter().map(|pair| format!("{:.2}x {}", pair.posted_gain(), pair.setting)).collect()
    };
    let mut note = format!("post {}", posted.join(", "));
    if let Some(gain) = first.measured_gain(group, metric) {
        note.push_str(&format!("; here {gain:.2}x"));
    }
    Some(note)
}

/// The posted pairs of seed `id` (000 to 004), in the order of its groups.
pub fn for_seed(id: &str) -> &'static [Posted] {
    match id {
        "000" => SEED_000,
        "001" => SEED_001,
        "002" => SEED_002,
        "003" => SEED_003,
        "004" => SEED_004,
        _ => &[],
    }
}

/// The posted pairs that belong to `group`.
pub fn for_group<'a>(id: &str, group: &'a Group) -> impl Iterator<Item = &'static Posted> + 'a {
    for_seed(id).iter().filter(move |posted| posted.group == group.name)
}

const SEED_000: &[Posted] = &[Posted {
    group: "2 KiB direct writes, 8 jobs",
    setting: "ext4, 64-CPU guest, iodepth 256",
    unit: "IOPS",
    old: Figure { label: "v6.2", value: 4_328.0 },
    new: Figure { label: "patched", value: 801_000.0 },
    measured_old: "dio_unaligned=exclusive",
    measured_new: "dio_unaligned=overwrite",
}];

const SEED_001: &[Posted] = &[Posted {
    group: "4 KiB random overwrites + fdatasync, 64 KiB folios",
    setting: "XFS 4 KiB blocks on NVMe, 64 KiB pages",
    unit: "MB/s",
    old: Figure { label: "per-folio dirty", value: 28.0 },
    new: Figure { label: "per-block dirty", value: 452.0 },
    measured_old: "dirty=folio",
    measured_new: "dirty=block",
}];

/// Seed 002's post gives iomap's IOPS relative to the old direct I/O code
/// of 5.4; the nearest pair here is the engine against the raw device.
const fn seed_002(group: &'static str, setting: &'static str, relative: f64) -> Posted {
    Posted {
        group,
        setting,
        unit: "x old DIO",
        old: Figure { label: "5.4 DIO", value: 1.0 },
        new: Figure { label: "5.13 iomap", value: relative },
        measured_old: "raw device",
        measured_new: "foliofs",
    }
}

const SEED_002: &[Posted] = &[
    seed_002("randread 4k, iodepth 64", "ext4", 1.012),
    seed_002("randread 4k, iodepth 64", "XFS", 1.002),
    seed_002("randread 16k, iodepth 64", "ext4", 1.000),
    seed_002("randread 16k, iodepth 64", "XFS", 1.000),
    seed_002("randwrite 4k, iodepth 64", "ext4", 0.806),
    seed_002("randwrite 4k, iodepth 64", "XFS", 1.010),
    seed_002("randwrite 16k, iodepth 64", "ext4", 1.000),
    seed_002("randwrite 16k, iodepth 64", "XFS", 1.002),
];

const fn seed_003(group: &'static str, old: f64, new: f64) -> Posted {
    Posted {
        group,
        setting: "QEMU virtio-blk cache=directsync on NVMe",
        unit: "IOPS",
        old: Figure { label: "flush after write", value: old },
        new: Figure { label: "FUA", value: new },
        measured_old: "fua=emulate",
        measured_new: "fua=native",
    }
}

const SEED_003: &[Posted] = &[
    seed_003("4 KiB O_DSYNC writes, iodepth 1, 1 jobs", 45_600.0, 56_100.0),
    seed_003("4 KiB O_DSYNC writes, iodepth 1, 16 jobs", 183_300.0, 236_000.0),
    seed_003("4 KiB O_DSYNC writes, iodepth 16, 1 jobs", 258_400.0, 311_100.0),
];

/// Seed 004's post: ext4's buffer_head path against iomap with large
/// folios; here 4 KiB folios against large ones. Writes are its cached
/// overwrites (no sync, no writeback), reads its reads of a hole (no
/// device I/O), the nearest to this run's cached shapes.
const fn seed_004(group: &'static str, setting: &'static str, old: f64, new: f64) -> Posted {
    Posted {
        group,
        setting,
        unit: "MiB/s",
        old: Figure { label: "buffer_head", value: old },
        new: Figure { label: "large folios", value: new },
        measured_old: "folio_max=4k",
        measured_new: "foliofs",
    }
}

const SEED_004: &[Posted] = &[
    seed_004("buffered write 4k", "ext4, cached overwrites", 1_755.0, 1_834.0),
    seed_004("buffered write 64k", "ext4, cached overwrites", 2_290.0, 5_142.0),
    seed_004("buffered write 1M", "ext4, cached overwrites", 2_352.0, 5_577.0),
    seed_004("buffered read 4k", "ext4, reads of a hole", 2_253.0, 2_975.0),
    seed_004("buffered read 64k", "ext4, reads of a hole", 3_043.0, 4_860.0),
    seed_004("buffered read 1M", "ext4, reads of a hole", 2_960.0, 4_942.0),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::Row;

    fn row(label: &str, iops: f64) -> Row {
        Row {
            label: label.into(),
            iops,
            mib_per_second: iops / 256.0,
            p99_us: 0.0,
            write_amplification: None,
            requests_per_io: None,
        }
    }

    #[test]
    fn every_posted_pair_has_a_positive_gain_and_names_two_rows() {
        for id in ["000", "001", "002", "003", "004"] {
            let posted = for_seed(id);
            assert!(!posted.is_empty(), "seed {id} quotes its post");
            for pair in posted {
                assert!(pair.old.value > 0.0 && pair.new.value > 0.0, "{}", pair.group);
                assert_ne!(pair.measured_old, pair.measured_new, "{}", pair.group);
            }
        }
        assert!(for_seed("999").is_empty());
    }

    #[test]
    fn the_summary_sets_the_posted_gain_beside_the_measured_one() {
        let group = Group {
            name: "2 KiB direct writes, 8 jobs".into(),
            command: String::new(),
            rows: vec![
                row("dio_unaligned=overwrite", 300_000.0),
                row("dio_unaligned=exclusive", 20_000.0),
            ],
        };
        let posted: Vec<_> = for_group("000", &group).collect();
        assert_eq!(posted.len(), 1);
        let line = posted[0].summary(&group, Metric::Iops);
        assert!(line.contains("v6.2 4,328 -> patched 801,000 IOPS, 185.07x"), "{line}");
        assert!(
            line.ends_with("here dio_unaligned=exclusive -> dio_unaligned=overwrite: 15.00x"),
            "{line}"
        );
        assert_eq!(chart_note("000", &group, Metric::Iops).unwrap(), "post 185.07x; here 15.00x");
    }

    #[test]
    fn a_shape_with_several_posted_pairs_names_each_setting() {
        let group = Group {
            name: "randwrite 4k, iodepth 64".into(),
            command: String::new(),
            rows: vec![row("foliofs", 900.0), row("raw device", 1000.0)],
        };
        assert_eq!(
            chart_note("002", &group, Metric::Iops).unwrap(),
            "post 0.81x ext4, 1.01x XFS; here 0.90x"
        );
        let unquoted = Group { name: "round trip".into(), command: String::new(), rows: vec![] };
        assert_eq!(chart_note("002", &unquoted, Metric::Iops), None);
    }

    #[test]
    fn a_missing_row_leaves_only_the_posted_gain() {
        let group = Group {
            name: "buffered read 1M".into(),
            command: String::new(),
            rows: vec![row("foliofs", 1000.0)],
        };
        let posted: Vec<_> = for_group("004", &group).collect();
        assert_eq!(posted.len(), 1);
        assert_eq!(posted[0].measured_gain(&group, Metric::MibPerSecond), None);
        assert_eq!(chart_note("004", &group, Metric::MibPerSecond).unwrap(), "post 1.67x");
    }
}
