use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use foliofs::dev::Device;
use foliofs::VolumeOptions;

pub fn run(image: &Path, options: &VolumeOptions) -> anyhow::Result<ExitCode> {
    let dev_options = VolumeOptions { read_only: true, ..options.clone() }.dev_options();
    let device =
        Device::open(image, &dev_options).with_context(|| format!("open {}", image.display()))?;
    let report = foliofs::fsck::check(Arc::new(device));
    for note in &report.notes {
        println!("note: {note}");
    }
    for problem in &report.problems {
        println!("problem: {problem}");
    }
    if let Some(load) = report.load {
        println!(
            "{}: {} files, {} directories, {} symlinks, {} special files, {} extended \
             attributes, {} extents, {} data blocks; checkpoint generation {}, {} journal \
             groups replayed",
            image.display(),
            report.files,
            report.directories,
            report.symlinks,
            report.special_files,
            report.xattrs,
            report.extents,
            report.data_blocks_used,
            load.checkpoint_generation,
            load.journal_groups_replayed
        );
    }
    if report.is_clean() {
        println!("{}: clean", image.display());
        Ok(ExitCode::SUCCESS)
    } else {
        println!("{}: {} problems found", image.display(), report.problems.len());
        Ok(ExitCode::from(1))
    }
}
