//! What the `bench scale` tests (cli.rs in process, mount.rs through the
//! mount) check in its JSON.

/// Checks `bench scale`'s JSON for one target's run of `files`: every file
/// made in its windows, the close and the opens measured, the stat pass over
/// every file, and after the kill -9 every file reported durable found.
pub fn check_scale_target(json: &serde_json::Value, target: &str, files: u64) {
    let run = json["targets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|run| run["target"] == target)
        .unwrap_or_else(|| panic!("no {target} in {json}"));
    assert!(run["error"].is_null(), "{run}");
    assert_eq!(run["created"], files, "{run}");
    let windows = run["windows"].as_array().unwrap();
    assert_eq!(windows.len(), 10, "windows of a tenth: {run}");
    let made: u64 = windows.iter().map(|window| window["files"].as_u64().unwrap()).sum();
    assert_eq!(made, files, "{run}");
    let slowest = run["window_rate_slowest"].as_f64().unwrap();
    assert!(slowest > 0.0 && slowest <= run["window_rate_median"].as_f64().unwrap(), "{run}");
    for key in ["close_seconds", "open_seconds"] {
        assert!(run[key].as_f64().unwrap() > 0.0, "{key}: {run}");
    }
    assert!(run["memory_bytes"].as_u64().unwrap() > 0, "{run}");
    assert_eq!(run["stat"]["stats"], files, "{run}");
    let crash = &run["crash"];
    let (durable, found) = (crash["durable"].as_u64().unwrap(), crash["found"].as_u64().unwrap());
    // Killed once half were reported durable, before the last window.
    assert!(durable >= files / 2 && durable < files, "{crash}");
    assert!(durable <= found && found <= files, "{crash}");
    assert_eq!(crash["missing_durable"], 0, "{crash}");
    assert!(crash["open_seconds"].as_f64().unwrap() > 0.0, "{crash}");
}
