//! Small-file writes that survive a crash.

use std::io::Write;
use std::path::Path;

/// Writes `bytes` to `path` so that a crash leaves either the old content or the new:
/// a temporary file beside it (`.tmp` appended to the extension), fsync, rename over
/// `path`, fsync of the directory. For small metadata files (a collections manifest, a
/// cluster state), not data.
///
/// # Errors
/// Any I/O error; `path` then still holds its old content.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_new_content_replaces_the_old_and_no_temporary_file_stays() {
        let dir = std::env::temp_dir().join(format!("epkv-types-fs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state.json");
        write_atomically(&path, b"one").unwrap();
        write_atomically(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        assert!(!dir.join("state.json.tmp").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
