//! The file-system seam: [`Vfs`] and [`VFile`], with the real implementation [`RealFs`].
//! The fault-injecting implementation is [`crate::FaultFs`].
//!
//! Only positional reads and writes are used (`pread`/`pwrite`), so one open handle can
//! serve concurrent readers while the single writer appends.

use std::fmt::Debug;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The alignment of direct writes' offsets, lengths and buffers ([`Vfs::open_direct`]):
/// the page size, which is at least every device's logical block size.
pub const DIRECT_ALIGN: usize = 4096;

/// How to open a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    /// Read and write; create it if missing.
    Create,
    /// Read and write; fail with `NotFound` if missing.
    Existing,
}

/// An open file.
#[expect(
    clippy::len_without_is_empty,
    reason = "a file length query, not a collection"
)]
pub trait VFile: Send + Sync + Debug {
    /// Reads exactly `buf.len()` bytes at `offset`.
    ///
    /// # Errors
    /// `UnexpectedEof` past the end, or the OS error.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Writes all of `buf` at `offset`.
    ///
    /// # Errors
    /// The OS error; some bytes may have been written.
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// fdatasync.
    ///
    /// # Errors
    /// The OS error; the unsynced bytes must then be treated as lost.
    fn sync_data(&self) -> io::Result<()>;
    /// Current length.
    ///
    /// # Errors
    /// The OS error.
    fn len(&self) -> io::Result<u64>;
    /// Truncates or extends to `len`.
    ///
    /// # Errors
    /// The OS error.
    fn set_len(&self, len: u64) -> io::Result<()>;
}

/// A file system.
pub trait Vfs: Send + Sync + Debug {
    /// Opens a file.
    ///
    /// # Errors
    /// The OS error (`NotFound`, EMFILE, ...).
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn VFile>>;
    /// Renames a file (atomically replacing `to`).
    ///
    /// # Errors
    /// The OS error.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Removes a file.
    ///
    /// # Errors
    /// The OS error.
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// Lists the files of a directory.
    ///
    /// # Errors
    /// The OS error.
    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>>;
    /// Creates a directory and its parents.
    ///
    /// # Errors
    /// The OS error.
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// Opens an existing file for direct writes (`O_DIRECT`: no page cache; each write
    /// must start at a multiple of [`DIRECT_ALIGN`], be a multiple of it long, and come
    /// from memory aligned to it). `Ok(None)` when this file system does not do direct
    /// I/O (tmpfs, for one); the caller then writes through [`Vfs::open`]'s handle.
    ///
    /// # Errors
    /// The OS error.
    fn open_direct(&self, path: &Path) -> io::Result<Option<Arc<dyn VFile>>> {
        let _ = path;
        Ok(None)
    }
    /// Syncs a directory, making created, renamed and removed names durable.
    ///
    /// # Errors
    /// The OS error.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
}

/// The real file system.
#[derive(Debug, Clone, Copy, Default)]
pub struct RealFs;

#[derive(Debug)]
struct RealFile(File);

impl VFile for RealFile {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.0.read_exact_at(buf, offset)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.0.write_all_at(buf, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }
    fn len(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
}

impl Vfs for RealFs {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn VFile>> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(mode == OpenMode::Create)
            .truncate(false)
            .open(path)?;
        Ok(Arc::new(RealFile(f)))
    }
    fn open_direct(&self, path: &Path) -> io::Result<Option<Arc<dyn VFile>>> {
        use std::os::unix::fs::OpenOptionsExt;
        match OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
        {
            Ok(f) => Ok(Some(Arc::new(RealFile(f)))),
            // The file system does not do direct I/O.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(None),
            Err(e) => Err(e),
        }
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        let mut v = Vec::new();
        for e in std::fs::read_dir(dir)? {
            let e = e?;
            if e.file_type()?.is_file() {
                v.push(e.path());
            }
        }
        v.sort();
        Ok(v)
    }
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }
}
