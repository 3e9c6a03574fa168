pub mod bench;
pub mod fallocate;
pub mod files;
pub mod fsck;
pub mod info;
pub mod mkfs;
pub mod mount;
