//! `IMAGE:/path` arguments.

use std::path::PathBuf;

/// A path inside a volume image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImagePath {
    pub image: PathBuf,
    /// Absolute path inside the volume ("/" for the root).
    pub path: String,
}

impl ImagePath {
    /// Parses `IMAGE:/path` (also `IMAGE:` or `IMAGE:path` for paths from
    /// the root). Returns None when there is no `:`, i.e. a host path.
    pub fn parse(text: &str) -> Option<Self> {
        let (image, path) = text.split_once(':')?;
        if image.is_empty() {
            return None;
        }
        let path = format!("/{}", path.trim_start_matches('/'));
        Some(Self { image: PathBuf::from(image), path })
    }

    /// Parses an argument that must name a path inside an image.
    pub fn require(text: &str) -> anyhow::Result<Self> {
        Self::parse(text)
            .ok_or_else(|| anyhow::anyhow!("{text:?} is not IMAGE:/path (a path inside a volume)"))
    }

    /// The parent directory and the last component (None for the root).
    pub fn split(&self) -> Option<(String, String)> {
        let trimmed = self.path.trim_end_matches('/');
        let (parent, name) = trimmed.rsplit_once('/')?;
        if name.is_empty() {
            return None;
        }
        Some((if parent.is_empty() { "/".into() } else { parent.into() }, name.into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_image_paths() {
        let parsed = ImagePath::parse("vol.img:/a/b").unwrap();
        assert_eq!(parsed, ImagePath { image: "vol.img".into(), path: "/a/b".into() });
        assert_eq!(ImagePath::parse("vol.img:").unwrap().path, "/");
        assert_eq!(ImagePath::parse("vol.img:x").unwrap().path, "/x");
        assert!(ImagePath::parse("plain/host/path").is_none());
        assert!(ImagePath::parse(":/x").is_none());
        assert_eq!(parsed.split(), Some(("/a".into(), "b".into())));
        assert_eq!(ImagePath::parse("v:/top").unwrap().split(), Some(("/".into(), "top".into())));
        assert_eq!(ImagePath::parse("v:/").unwrap().split(), None);
    }
}
