pub mod bench;
pub mod files;
pub mod fsck;
pub mod info;
pub mod mkfs;
