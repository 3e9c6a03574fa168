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
        let (image, path) = split_nbd_uri(text).or_else(|| text.split_once(':'))?;
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

/// An NBD URI's own colons (scheme, port) come before the export's `/`;
/// the first colon after it starts the path inside the volume.
fn split_nbd_uri(text: &str) -> Option<(&str, &str)> {
    let scheme_end = ["nbd://", "nbd+unix://"]
        .iter()
        .find_map(|scheme| text.starts_with(scheme).then_some(scheme.len()))?;
    let export_start = scheme_end + text[scheme_end..].find('/')?;
    let colon = export_start + text[export_start..].find(':')?;
    Some((&text[..colon], &text[colon + 1..]))
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

    #[test]
    fn parses_nbd_uris_as_images() {
        let tcp = ImagePath::parse("nbd://host:10810/disk:/a/b").unwrap();
        assert_eq!(tcp, ImagePath { image: "nbd://host:10810/disk".into(), path: "/a/b".into() });
        let unix = ImagePath::parse("nbd+unix:///vol?socket=/tmp/s.sock:/x").unwrap();
        assert_eq!(unix.image, PathBuf::from("nbd+unix:///vol?socket=/tmp/s.sock"));
        assert_eq!(unix.path, "/x");
        assert_eq!(ImagePath::parse("nbd://host/disk:").unwrap().path, "/");
    }
}
