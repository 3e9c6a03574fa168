//! Where a bench's CPU went: the process's threads grouped by name, read
//! from Linux's /proc (utime + stime, in USER_HZ ticks, which the kernel ABI
//! fixes at 100 a second). On 2 CPUs a job's speed-up is bounded by the CPU
//! the engine's own threads spend beside it, so the benches print both.

use std::collections::BTreeMap;

const TICKS_PER_SECOND: f64 = 100.0;

/// CPU seconds of the whole process so far, or None off Linux.
pub fn process_seconds() -> Option<f64> {
    stat_seconds(&std::fs::read_to_string("/proc/self/stat").ok()?)
}

/// CPU seconds of the calling thread so far, or None off Linux.
pub fn thread_seconds() -> Option<f64> {
    stat_seconds(&std::fs::read_to_string("/proc/thread-self/stat").ok()?)
}

/// CPU seconds of each live thread of the process, summed by thread name
/// (the engine names its threads: `foliofs-commit`, `foliofs-slabs`, ...).
pub fn seconds_by_thread_name() -> BTreeMap<String, f64> {
    let mut by_name = BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return by_name;
    };
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        if let (Some(name), Some(seconds)) = (stat_name(&stat), stat_seconds(&stat)) {
            *by_name.entry(name.to_owned()).or_insert(0.0) += seconds;
        }
    }
    by_name
}

/// The CPU each thread name used between two [`seconds_by_thread_name`]
/// readings, largest first, leaving out names that used none. A thread
/// that started between them counts from zero; one that ended is missing.
pub fn used_between(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
) -> Vec<(String, f64)> {
    let mut used: Vec<(String, f64)> = after
        .iter()
        .map(|(name, seconds)| (name.clone(), seconds - before.get(name).copied().unwrap_or(0.0)))
        .filter(|(_, seconds)| *seconds > 0.0)
        .collect();
    used.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    used
}

/// The name in a stat line: between the first '(' and the last ')', since
/// the name itself may hold spaces and parentheses.
fn stat_name(stat: &str) -> Option<&str> {
    stat.get(stat.find('(')? + 1..stat.rfind(')')?)
}

/// utime + stime of a stat line, in seconds.
fn stat_seconds(stat: &str) -> Option<f64> {
    // Fields are counted after the name's ')': state is the first, utime
    // and stime the 12th and 13th.
    let fields: Vec<&str> = stat.get(stat.rfind(')')? + 2..)?.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) as f64 / TICKS_PER_SECOND)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_gives_its_name_and_cpu_even_with_odd_names() {
        let stat = "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 1 0";
        assert_eq!(stat_name(stat), Some("a (b) c"));
        assert_eq!(stat_seconds(stat), Some(3.25));
        assert_eq!(stat_seconds("4242 (cut"), None);
        assert_eq!(stat_seconds("4242 (short) S 1 2"), None);
    }

    #[test]
    fn cpu_used_between_readings_is_sorted_and_counts_new_threads_from_zero() {
        let before = BTreeMap::from([("commit".to_owned(), 1.0), ("idle".to_owned(), 2.0)]);
        let after = BTreeMap::from([
            ("commit".to_owned(), 1.5),
            ("idle".to_owned(), 2.0),
            ("job".to_owned(), 0.75),
        ]);
        assert_eq!(
            used_between(&before, &after),
            vec![("job".to_owned(), 0.75), ("commit".to_owned(), 0.5)]
        );
    }

    #[test]
    fn cpu_this_thread_spends_is_seen_by_the_process_and_its_threads() {
        let process_before =
            process_seconds().expect("/proc/self/stat (the project runs on Linux)");
        let by_name_before = seconds_by_thread_name();
        let thread_before = thread_seconds().expect("a thread stat beside the process stat");
        let started = std::time::Instant::now();
        let mut spin = 0u64;
        while thread_seconds().expect("thread stat") - thread_before < 0.05 {
            spin = spin.wrapping_add(1);
            assert!(started.elapsed().as_secs() < 60, "50 ms of CPU never counted");
        }
        assert!(process_seconds().expect("process stat") - process_before >= 0.05);
        let used = used_between(&by_name_before, &seconds_by_thread_name());
        let total: f64 = used.iter().map(|(_, seconds)| seconds).sum();
        assert!(total >= 0.05, "{used:?}");
        std::hint::black_box(spin);
    }
}
