//! The compile cache: shared objects stored under a key, checked before use.
//!
//! An object is compiled from the C source, the runtime header and the full compiler command,
//! by the compiler with its identity (resolved path, size, modification time): the
//! [`ObjectKey`], a BLAKE3 hash (64 hexadecimal digits) of these, is compiled into the object,
//! as the exported array `arrayjit_cache_key_<object key>` holding it (appended to the source
//! that is compiled, not to the source the key is computed from). The entry's key adds the
//! [`Target::fingerprint`] (what the compiler makes of the architecture flags on this
//! machine) to the object key, so that the target need not be known when the compile starts
//! (see the `speculate` module); the stored file ends with a trailer that the loader ignores:
//! the entry's key, the object's BLAKE3 checksum and a magic number.
//!
//! A cache entry is only opened if its trailer names its key and its checksum matches (so a
//! truncated, damaged or foreign file is never handed to `dlopen`), and only used if the
//! loaded object's symbol holds the object key; anything else (another program's library
//! copied over the entry, another entry, a truncated or garbage file) is deleted and compiled
//! again. Objects are only stored under a key whose target fingerprint is the probed target's.
//!
//! Nothing another user could have written is used: the directory must be the user's alone,
//! and every file is checked (owner, mode, type, size) on the descriptor it is then read
//! through, before anything in it is trusted; an entry's checked bytes are what is loaded
//! (see "Trust" below, before [`euid`]).
//!
//! The cache is bounded ([`CompilerConfig::cache_max_bytes`], `ARRAYJIT_CACHE_MAX`): a hit
//! sets its entry's modification time to now, and after storing an entry the least recently
//! used entries are deleted until the entries fit (see [`CompileCache`]).

use std::ffi::OsStr;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::cleanup::WorkDir;
use super::config::{cache_settings, CompilerConfig};
use super::files::{hash_hex, open_private, read_all, trusted_dir};
use super::load::{open_library, symbol_address, Handle};
use super::programs::program_identity;
use super::target::Target;
use super::RUNTIME_HEADER;
use crate::{Error, Result};

/// What an object is compiled from: its key (64 hexadecimal digits) covers the C source,
/// the runtime header, the full command and the compiler's identity, and is compiled into the
/// object ([`ObjectKey::marker`]).
pub(super) struct ObjectKey {
    key: String,
}

impl ObjectKey {
    /// The key of compiling `source` with `command` under `config`, or `None` when the
    /// compiler cannot be identified (then the cache is bypassed rather than risk reusing
    /// another compiler's output).
    pub(super) fn new(config: &CompilerConfig, source: &str, command: &str) -> Option<ObjectKey> {
        let identity = program_identity(&config.compiler)?;
        let key = hash_hex(&[
            b"arrayjit-object-v4",
            config.compiler.as_os_str().as_encoded_bytes(),
            identity.as_bytes(),
            command.as_bytes(),
            RUNTIME_HEADER.as_bytes(),
            source.as_bytes(),
        ]);
        Some(ObjectKey { key })
    }

    /// The name of the symbol that carries the key in the object.
    fn symbol(&self) -> String {
        format!("arrayjit_cache_key_{}", self.key)
    }

    /// The C text appended to the source that is compiled: an exported, always-kept array
    /// named after the key and holding it.
    pub(super) fn marker(&self) -> String {
        let sym = self.symbol();
        format!(
            "\n/* arrayjit compile cache key */\n\
             extern const char {sym}[];\n\
             __attribute__((visibility(\"default\"), used)) const char {sym}[] = \"{}\";\n",
            self.key
        )
    }
}

/// One cache entry: `<cache dir>/<key>.so`.
pub(super) struct CacheEntry {
    /// The entry's path.
    pub path: PathBuf,
    /// The entry's key (64 hexadecimal digits): the object key and the target's fingerprint.
    key: String,
    /// The key compiled into the object.
    object: ObjectKey,
    /// The cache's size limit for objects ([`CompilerConfig::cache_max_bytes`]).
    max_bytes: u64,
    /// Where the private temporary directories go ([`CompilerConfig::temp_root`]).
    temp_root: PathBuf,
}

/// Why loading a checked entry failed.
enum LoadFailure {
    /// Copying it to a private temporary directory failed (not the entry's fault).
    Copy(Error),
    /// The loader refused it.
    Load(Error),
}

/// What looking an entry up found.
pub(super) enum Lookup {
    /// A valid entry, loaded.
    Hit(Handle),
    /// No entry.
    Miss,
    /// An invalid entry, which was deleted; why it was invalid.
    Discarded(String),
}

impl CacheEntry {
    /// The entry in `dir` for the object `object` compiled for `target` under `config`.
    pub(super) fn new(
        dir: &Path,
        config: &CompilerConfig,
        object: ObjectKey,
        target: &Target,
    ) -> CacheEntry {
        let key = hash_hex(&[
            b"arrayjit-cache-v4",
            object.key.as_bytes(),
            target.fingerprint.as_bytes(),
        ]);
        CacheEntry {
            path: dir.join(format!("{key}.so")),
            key,
            object,
            max_bytes: config.cache_max_bytes,
            temp_root: config.temp_root.clone().unwrap_or_else(std::env::temp_dir),
        }
    }

    /// Looks the entry up. An entry that exists but is not this key's object, or that fails
    /// the checks of [`open_private`] (another user's file, one group or others can write, a
    /// symbolic link, a FIFO, a file larger than the limit), is deleted; the refusals of
    /// [`open_private`] are also logged as warnings.
    ///
    /// The entry is read through the descriptor that was checked, its trailer and checksum
    /// are checked on the bytes read, and those same bytes are what is loaded: they are
    /// written to a fresh file in a new private (0700) temporary directory, which is loaded
    /// and deleted. So nothing that changes the entry after the checks (a rename over it, a
    /// write into it) can change what is loaded. (Loading `/proc/self/fd/N` of the checked
    /// descriptor instead would avoid the copy, but the loader recognises libraries by name:
    /// a later entry opened under the same descriptor number would get the earlier library.)
    pub(super) fn lookup(&self) -> Lookup {
        let limit = self.max_bytes.min(MAX_ENTRY_BYTES);
        let file = match open_private(&self.path, limit) {
            Ok(Some(f)) => f,
            Ok(None) => return Lookup::Miss,
            Err(e @ Error::UnsafeFile { .. }) => {
                tracing::warn!(target: "arrayjit::compile", "compile cache: {e}; deleting it");
                return self.discard(format!("is refused ({e})"));
            }
            Err(e) => return self.discard(format!("cannot be read: {e}")),
        };
        let bytes = match read_all(&self.path, &file, limit) {
            Ok(b) => b,
            Err(e) => return self.discard(format!("cannot be read: {e}")),
        };
        let Some((object, trailer)) = bytes
            .len()
            .checked_sub(TRAILER_LEN)
            .map(|n| bytes.split_at(n))
            .filter(|(_, t)| t.ends_with(TRAILER_MAGIC))
        else {
            return self
                .discard("has no arrayjit cache trailer (it was not stored by arrayjit)".into());
        };
        if &trailer[..KEY_LEN] != self.key.as_bytes() {
            return self.discard(format!(
                "holds the object stored under key {}",
                String::from_utf8_lossy(&trailer[..KEY_LEN])
            ));
        }
        if trailer[KEY_LEN..KEY_LEN + CHECKSUM_LEN] != checksum(object) {
            return self.discard("is damaged (its checksum does not match)".into());
        }
        let sym = self.object.symbol();
        let lib = match self.load_copy(object) {
            Ok(lib) => lib,
            Err(LoadFailure::Copy(e)) => {
                // Not the entry's fault (e.g. a full temporary directory): keep it.
                tracing::info!(target: "arrayjit::compile", "compile cache: {e}; compiling again");
                return Lookup::Miss;
            }
            Err(LoadFailure::Load(e)) => return self.discard(format!("cannot be loaded: {e}")),
        };
        drop(bytes);
        let addr = match symbol_address(&lib, &sym) {
            Ok(a) => a,
            Err(msg) => {
                drop(lib);
                return self.discard(msg);
            }
        };
        let expected = format!("{}\0", self.object.key);
        // SAFETY: `addr` is the non-null address of the symbol `arrayjit_cache_key_<key>`,
        // which only the marker this module appends defines: a `const char` array of exactly
        // `key.len() + 1` bytes (the key and its terminating NUL), mapped read-only for as long
        // as `lib` is loaded (it is, until after this comparison).
        let stored =
            unsafe { std::slice::from_raw_parts(addr as *const u8, expected.len()) }.to_vec();
        if stored != expected.as_bytes() {
            drop(lib);
            return self.discard(format!("its symbol {sym} holds another key"));
        }
        // Recently used: evicted last. Through the checked descriptor (the owner may set the
        // times of a file opened read-only), not the path. A failure only makes the entry
        // look older.
        let _ = file.set_modified(SystemTime::now());
        Lookup::Hit(lib)
    }

    /// Loads the checked bytes of an entry from a fresh private temporary directory (see
    /// [`lookup`](Self::lookup)), which is deleted again (the loaded mapping stays valid).
    fn load_copy(&self, object: &[u8]) -> std::result::Result<Handle, LoadFailure> {
        use std::os::unix::fs::OpenOptionsExt;
        let tmp = WorkDir::create(&self.temp_root).map_err(LoadFailure::Copy)?;
        let path = tmp.path().join(format!("{}.so", self.key));
        let written = fs::File::options()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .and_then(|mut f| f.write_all(object));
        if let Err(e) = written {
            return Err(LoadFailure::Copy(Error::io(
                format!("copying a cache entry to {}", path.display()),
                e,
            )));
        }
        let lib = open_library(&path).map_err(LoadFailure::Load)?;
        let _ = tmp.close();
        Ok(lib)
    }

    /// Deletes an invalid entry (failures only mean it is overwritten later).
    fn discard(&self, why: String) -> Lookup {
        let _ = fs::remove_file(&self.path);
        Lookup::Discarded(format!("cache entry {} {why}", self.path.display()))
    }

    /// Copies a freshly built library into the cache atomically (a temporary file in the cache
    /// directory, then a rename), so a concurrent reader sees either nothing or the whole
    /// file, and appends the trailer; then deletes the least recently used entries until the
    /// entries fit in the size limit (never this one). An object larger than the limit is not
    /// stored. Failures only cost the cache entry.
    pub(super) fn store(&self, built: &Path) {
        let Some(dir) = self.path.parent() else {
            return;
        };
        let Ok(mut object) = fs::read(built) else {
            return;
        };
        if (object.len() + TRAILER_LEN) as u64 > self.max_bytes.min(MAX_ENTRY_BYTES) {
            return;
        }
        if !trusted_dir(dir) {
            return;
        }
        // A temporary file of mode 0600, renamed over the entry.
        let Ok(mut tmp) = tempfile::Builder::new().prefix(".tmp-").tempfile_in(dir) else {
            return;
        };
        let sum = checksum(&object);
        object.extend_from_slice(self.key.as_bytes());
        object.extend_from_slice(&sum);
        object.extend_from_slice(TRAILER_MAGIC);
        if tmp.write_all(&object).is_ok() && tmp.persist(&self.path).is_ok() {
            let _ = evict(dir, self.max_bytes, Some(&self.path));
        }
    }
}

/// Sets a file's modification time to now (as a hit does).
#[cfg(test)]
fn touch(path: &Path) -> io::Result<()> {
    fs::File::options()
        .write(true)
        .open(path)?
        .set_modified(SystemTime::now())
}

/// Temporary files (`.tmp-XXXXXX`, left by a process that died while storing) older than this
/// are deleted by the eviction.
const STALE_TEMPORARY: Duration = Duration::from_secs(3600);

/// The kinds of files arrayjit keeps in a cache directory. Nothing else there is touched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// A compiled object, `<key>.so` (a key of 64 hexadecimal digits, or 32 from arrayjit
    /// versions before BLAKE3).
    Object,
    /// A memo file, `detected-cc-<hash>` or `target-<hash>`.
    Memo,
    /// A temporary file being written, `.tmp-XXXXXX` (six letters or digits).
    Temporary,
}

impl Kind {
    /// The kind of a file called `name`, if it is one of arrayjit's.
    fn of(name: &OsStr) -> Option<Kind> {
        let name = name.to_str()?;
        let is_hash = |s: &str| {
            (s.len() == 64 || s.len() == 32)
                && s.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        if name.strip_suffix(".so").is_some_and(is_hash) {
            return Some(Kind::Object);
        }
        if name
            .strip_prefix("detected-cc-")
            .or_else(|| name.strip_prefix("target-"))
            .is_some_and(is_hash)
        {
            return Some(Kind::Memo);
        }
        let temporary = name
            .strip_prefix(".tmp-")
            .is_some_and(|r| r.len() == 6 && r.bytes().all(|b| b.is_ascii_alphanumeric()));
        temporary.then_some(Kind::Temporary)
    }
}

/// One of arrayjit's files in a cache directory.
struct Found {
    path: PathBuf,
    kind: Kind,
    bytes: u64,
    modified: SystemTime,
}

/// arrayjit's files in `dir`: regular files (not symbolic links, not directories) whose names
/// are of a [`Kind`]. A missing directory holds nothing.
fn scan(dir: &Path) -> io::Result<Vec<Found>> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry?;
        let Some(kind) = Kind::of(&entry.file_name()) else {
            continue;
        };
        // `DirEntry::metadata` does not follow symbolic links.
        let Ok(meta) = entry.metadata() else {
            continue; // deleted meanwhile
        };
        if !meta.file_type().is_file() {
            continue;
        }
        found.push(Found {
            path: entry.path(),
            kind,
            bytes: meta.len(),
            modified: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
        });
    }
    Ok(found)
}

/// Deletes a file; one that is already gone counts as deleted.
fn unlink(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Deletes the least recently used (oldest modification time) objects in `dir` until the
/// objects take at most `max_bytes`, never `keep`, and temporary files older than
/// [`STALE_TEMPORARY`]. Returns what was deleted.
///
/// Deleting is only unlinking: a process that has loaded an object keeps its mapping, and a
/// process that finds an entry gone (or a file it checked replaced) compiles again, so
/// concurrent processes sharing the directory are safe.
fn evict(dir: &Path, max_bytes: u64, keep: Option<&Path>) -> io::Result<CacheFiles> {
    let mut found = scan(dir)?;
    let mut removed = CacheFiles::default();
    let now = SystemTime::now();
    for f in found.iter().filter(|f| f.kind == Kind::Temporary) {
        let stale = now
            .duration_since(f.modified)
            .is_ok_and(|age| age > STALE_TEMPORARY);
        if stale && unlink(&f.path).is_ok() {
            removed.add(f.bytes);
        }
    }
    found.retain(|f| f.kind == Kind::Object);
    let mut total: u64 = found.iter().map(|f| f.bytes).sum();
    found.sort_by(|a, b| (a.modified, &a.path).cmp(&(b.modified, &b.path)));
    for f in &found {
        if total <= max_bytes {
            break;
        }
        if Some(f.path.as_path()) == keep {
            continue;
        }
        if unlink(&f.path).is_ok() {
            total -= f.bytes;
            removed.add(f.bytes);
        }
    }
    Ok(removed)
}

/// A number of files and their total size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheFiles {
    /// How many files.
    pub count: usize,
    /// Their total size in bytes.
    pub bytes: u64,
}

impl CacheFiles {
    fn add(&mut self, bytes: u64) {
        self.count += 1;
        self.bytes += bytes;
    }
}

/// What a compile cache directory holds (see [`CompileCache::info`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheInfo {
    /// Compiled objects (`<key>.so`); only these count against the size limit.
    pub objects: CacheFiles,
    /// The remembered compiler detections and target probes (`detected-cc-<hash>`,
    /// `target-<hash>`).
    pub memos: CacheFiles,
    /// Temporary files of stores in progress (or of processes that died while storing).
    pub temporary: CacheFiles,
}

impl CacheInfo {
    /// All of arrayjit's files together.
    pub fn total(&self) -> CacheFiles {
        CacheFiles {
            count: self.objects.count + self.memos.count + self.temporary.count,
            bytes: self.objects.bytes + self.memos.bytes + self.temporary.bytes,
        }
    }
}

/// The compile cache: a directory and the most bytes its compiled objects may take. For
/// inspecting, trimming and clearing the cache (what `arrayjit cache info|clear` do); compiles
/// use the cache through [`CompilerConfig::cache_dir`] and
/// [`CompilerConfig::cache_max_bytes`].
///
/// Only arrayjit's own files are ever counted or deleted: regular files named `<key>.so`,
/// `detected-cc-<hash>`, `target-<hash>` (hashes of hexadecimal digits) and `.tmp-XXXXXX`.
/// Anything else in the directory (a cache directory set to a directory with other files in
/// it by mistake, subdirectories, symbolic links) is left alone, and the directory itself is
/// never removed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompileCache {
    dir: PathBuf,
    max_bytes: u64,
}

impl CompileCache {
    /// The cache in `dir` with a limit of `max_bytes` for its objects.
    pub fn new(dir: impl Into<PathBuf>, max_bytes: u64) -> CompileCache {
        CompileCache {
            dir: dir.into(),
            max_bytes,
        }
    }

    /// The cache the environment configures (`ARRAYJIT_CACHE`, `ARRAYJIT_CACHE_DIR`,
    /// `XDG_CACHE_HOME`, `HOME`, `ARRAYJIT_CACHE_MAX`, read as by
    /// [`CompilerConfig::from_env`], without looking for a compiler); `None` if the cache is
    /// off or no directory is known. Junk in a variable is [`Error::Config`].
    pub fn from_env() -> Result<Option<CompileCache>> {
        let (dir, max_bytes) = cache_settings(|name| std::env::var_os(name))?;
        Ok(dir.map(|dir| CompileCache { dir, max_bytes }))
    }

    /// The cache directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The most bytes the compiled objects may take.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// Counts arrayjit's files in the directory (a missing directory holds none).
    pub fn info(&self) -> Result<CacheInfo> {
        let mut info = CacheInfo::default();
        for f in scan(&self.dir).map_err(|e| self.io_error("reading", e))? {
            match f.kind {
                Kind::Object => info.objects.add(f.bytes),
                Kind::Memo => info.memos.add(f.bytes),
                Kind::Temporary => info.temporary.add(f.bytes),
            }
        }
        Ok(info)
    }

    /// Deletes every one of arrayjit's files in the directory (see the type's documentation
    /// for which files those are); returns what was deleted. Processes using the cache
    /// meanwhile are not disturbed: loaded objects stay mapped, and a missing entry is
    /// compiled again. If some file cannot be deleted, the others still are and the first
    /// failure is returned.
    pub fn clear(&self) -> Result<CacheFiles> {
        let found = scan(&self.dir).map_err(|e| self.io_error("reading", e))?;
        let mut removed = CacheFiles::default();
        let mut first_error = None;
        for f in found {
            match unlink(&f.path) {
                Ok(()) => removed.add(f.bytes),
                Err(e) => {
                    first_error.get_or_insert_with(|| {
                        Error::io(format!("deleting {}", f.path.display()), e)
                    });
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(removed),
        }
    }

    /// Deletes the least recently used objects until the objects fit in
    /// [`max_bytes`](Self::max_bytes) (what happens after every store), and temporary files
    /// older than an hour; returns what was deleted.
    pub fn evict(&self) -> Result<CacheFiles> {
        evict(&self.dir, self.max_bytes, None).map_err(|e| self.io_error("evicting from", e))
    }

    fn io_error(&self, what: &str, e: io::Error) -> Error {
        Error::io(
            format!("{what} the compile cache directory {}", self.dir.display()),
            e,
        )
    }
}

/// Length of a cache key in bytes (hexadecimal digits).
const KEY_LEN: usize = 64;
/// Length of the object's checksum in the trailer.
const CHECKSUM_LEN: usize = blake3::OUT_LEN;
/// The last bytes of every stored entry.
const TRAILER_MAGIC: &[u8; 8] = b"AJCACHE2";
/// The trailer: the key, the object's checksum, the magic.
const TRAILER_LEN: usize = KEY_LEN + CHECKSUM_LEN + TRAILER_MAGIC.len();

/// The object's checksum (BLAKE3); with the key it is checked before an entry is opened.
fn checksum(bytes: &[u8]) -> [u8; CHECKSUM_LEN] {
    *blake3::hash(bytes).as_bytes()
}

// ---------------------------------------------------------------------------------------------
// Trust: what a file in the cache directory must be before arrayjit reads, loads or runs what
// it says.
//
// A cache entry is loaded into the process (its constructors run during `dlopen`, before any
// key check) and a `detected-cc-*` memo names a program that is run, so a file that another
// user could have written must never be used. The rules:
//
// - The cache directory is created with mode 0700 (whatever the umask), and used only if it is
//   a directory owned by the effective user that neither group nor others can write, and no
//   directory above it (as written and as resolved) is writable by group or others without
//   the sticky bit (such a parent lets another user rename the cache directory away and put
//   their own in its place). Otherwise a warning is logged (once per directory and process)
//   and the compile runs without the cache: no entry is read or stored, no memo is read or
//   written.
// - A file in it is opened with `O_NOFOLLOW | O_NONBLOCK` (a symbolic link is refused, a FIFO
//   cannot block), and the opened descriptor is checked with `fstat`: a regular file, owned by
//   the effective user, not writable by group or others, and not larger than a bound. Only
//   then is it read, through that same descriptor. A refused entry is logged as a warning,
//   deleted and compiled again; a refused memo is logged as a warning and rewritten.
// ---------------------------------------------------------------------------------------------

/// The largest cache entry that is ever read, whatever the cache's size limit: generated
/// objects are kilobytes to a few megabytes, so a larger file is not one arrayjit stored.
const MAX_ENTRY_BYTES: u64 = 1 << 30;

#[cfg(test)]
mod tests {
    use super::*;

    /// An object with an intact trailer for this key whose symbol is missing or holds
    /// another key is refused after loading (and deleted).
    #[test]
    fn the_key_compiled_into_the_object_is_checked_after_loading() {
        let cc = super::super::detect::detect_compiler(None).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let key = "0123456789abcdef".repeat(4);
        let entry = CacheEntry {
            path: dir.path().join(format!("{}.so", "e".repeat(64))),
            key: "e".repeat(64),
            object: ObjectKey { key: key.clone() },
            max_bytes: 1 << 30,
            temp_root: dir.path().to_path_buf(),
        };
        let build = |name: &str, source: &str| {
            fs::write(dir.path().join(format!("{name}.c")), source).unwrap();
            let status = std::process::Command::new(&cc)
                .args(["-shared", "-fPIC", "-o"])
                .arg(format!("lib{name}.so"))
                .arg(format!("{name}.c"))
                .current_dir(dir.path())
                .status()
                .unwrap();
            assert!(status.success());
            dir.path().join(format!("lib{name}.so"))
        };
        let good = build(
            "good",
            &format!("int f(void) {{ return 1; }}\n{}", entry.object.marker()),
        );
        entry.store(&good);
        assert!(matches!(entry.lookup(), Lookup::Hit(_)));

        let unmarked = build("unmarked", "int f(void) { return 2; }\n");
        entry.store(&unmarked);
        match entry.lookup() {
            Lookup::Discarded(why) => assert!(
                why.contains(&format!("symbol `arrayjit_cache_key_{key}` not found")),
                "{why}"
            ),
            _ => panic!("an object without the key symbol was used"),
        }
        assert!(!entry.path.exists(), "the invalid entry was not deleted");

        let sym = format!("arrayjit_cache_key_{key}");
        let wrong = build(
            "wrong",
            &format!("const char {sym}[] = \"{}\";\n", "f".repeat(64)),
        );
        entry.store(&wrong);
        match entry.lookup() {
            Lookup::Discarded(why) => assert!(why.ends_with("holds another key"), "{why}"),
            _ => panic!("an object with another key in its symbol was used"),
        }
        assert!(!entry.path.exists());
        assert!(matches!(entry.lookup(), Lookup::Miss));
    }

    #[test]
    fn checksum_sees_changes() {
        let a = checksum(b"0123456789abcdef-tail");
        assert_eq!(a, checksum(b"0123456789abcdef-tail"));
        assert_ne!(a, checksum(b"0123456789abcdef-tall"));
        assert_ne!(a, checksum(b"0123456789abcdeg-tail"));
        assert_ne!(a, checksum(b"0123456789abcdef-tai"));
        assert_ne!(checksum(b""), checksum(b"\0"));
    }

    /// A cache directory with objects of the given sizes, modified 1, 2, 3... seconds after
    /// `t0` in the given order, and files that are not arrayjit's.
    fn populate(dir: &Path, sizes: &[u64]) -> Vec<PathBuf> {
        let t0 = SystemTime::now() - Duration::from_secs(1000);
        let mut paths = Vec::new();
        for (i, &size) in sizes.iter().enumerate() {
            let path = dir.join(format!("{}.so", format!("{i:x}").repeat(64)));
            let f = fs::File::create(&path).unwrap();
            f.set_len(size).unwrap();
            f.set_modified(t0 + Duration::from_secs(i as u64 + 1))
                .unwrap();
            paths.push(path);
        }
        // Old and large, but not arrayjit's: never counted or deleted.
        for name in ["notes.txt", "ABCDEF0123456789ABCDEF0123456789.so", "x.so"] {
            let f = fs::File::create(dir.join(name)).unwrap();
            f.set_len(1 << 20).unwrap();
            f.set_modified(t0).unwrap();
        }
        fs::create_dir(dir.join(format!("{}.so", "e".repeat(64)))).unwrap();
        std::os::unix::fs::symlink(
            dir.join("notes.txt"),
            dir.join(format!("{}.so", "d".repeat(64))),
        )
        .unwrap();
        paths
    }

    fn others_are_intact(dir: &Path) {
        for name in ["notes.txt", "ABCDEF0123456789ABCDEF0123456789.so", "x.so"] {
            assert_eq!(
                fs::metadata(dir.join(name)).unwrap().len(),
                1 << 20,
                "{name}"
            );
        }
        assert!(dir.join(format!("{}.so", "e".repeat(64))).is_dir());
        assert!(dir
            .join(format!("{}.so", "d".repeat(64)))
            .symlink_metadata()
            .unwrap()
            .file_type()
            .is_symlink());
    }

    #[test]
    fn names_of_arrayjits_files() {
        let kind = |n: &str| Kind::of(OsStr::new(n));
        let h64 = "0123456789abcdef".repeat(4);
        let h32 = "0123456789abcdef".repeat(2);
        assert_eq!(kind(&format!("{h64}.so")), Some(Kind::Object));
        assert_eq!(kind(&format!("{h32}.so")), Some(Kind::Object));
        assert_eq!(kind(&format!("detected-cc-{h64}")), Some(Kind::Memo));
        assert_eq!(kind(&format!("target-{h32}")), Some(Kind::Memo));
        assert_eq!(kind(".tmp-Ab12Z9"), Some(Kind::Temporary));
        for other in [
            format!("{}.so", &h64[1..]),
            format!("{}.so", h64.to_uppercase()),
            format!("{h64}.so.1"),
            format!("lib{h64}.so"),
            format!("target-{h64}.bak"),
            format!("detected-cc-{h64}x"),
            ".tmp-abc".into(),
            ".tmp-abcdefg".into(),
            ".tmp-ab/cde".into(),
            "notes.txt".into(),
            ".".into(),
            "..".into(),
        ] {
            assert_eq!(kind(&other), None, "{other}");
        }
    }

    #[test]
    fn eviction_deletes_least_recently_used_objects_first() {
        let dir = tempfile::tempdir().unwrap();
        let p = populate(dir.path(), &[100, 200, 300, 400]);
        let cache = CompileCache::new(dir.path(), 1000);
        assert_eq!(
            cache.info().unwrap().objects,
            CacheFiles {
                count: 4,
                bytes: 1000
            }
        );
        // Within the limit: nothing happens.
        assert_eq!(cache.evict().unwrap(), CacheFiles::default());
        // 1000 > 750: the oldest two go (100 + 200), leaving 700.
        let removed = evict(dir.path(), 750, None).unwrap();
        assert_eq!(
            removed,
            CacheFiles {
                count: 2,
                bytes: 300
            }
        );
        assert!(!p[0].exists() && !p[1].exists() && p[2].exists() && p[3].exists());
        others_are_intact(dir.path());
        // A hit refreshes an entry: after touching the oldest, the other one goes.
        touch(&p[2]).unwrap();
        evict(dir.path(), 400, None).unwrap();
        assert!(p[2].exists() && !p[3].exists());
        // The entry just stored is kept even when it alone is over the limit.
        evict(dir.path(), 1, Some(&p[2])).unwrap();
        assert!(p[2].exists());
        evict(dir.path(), 1, None).unwrap();
        assert!(!p[2].exists());
        assert_eq!(
            CompileCache::new(dir.path(), 1).info().unwrap(),
            CacheInfo::default()
        );
        others_are_intact(dir.path());
    }

    #[test]
    fn stale_temporary_files_are_evicted() {
        let dir = tempfile::tempdir().unwrap();
        let old = dir.path().join(".tmp-Old123");
        let new = dir.path().join(".tmp-New123");
        fs::write(&old, b"partial").unwrap();
        fs::write(&new, b"partial").unwrap();
        fs::File::options()
            .write(true)
            .open(&old)
            .unwrap()
            .set_modified(SystemTime::now() - STALE_TEMPORARY - Duration::from_secs(60))
            .unwrap();
        let cache = CompileCache::new(dir.path(), 1 << 30);
        assert_eq!(cache.info().unwrap().temporary.count, 2);
        assert_eq!(cache.evict().unwrap(), CacheFiles { count: 1, bytes: 7 });
        assert!(!old.exists() && new.exists());
    }

    #[test]
    fn info_and_clear_touch_only_arrayjits_files() {
        let dir = tempfile::tempdir().unwrap();
        populate(dir.path(), &[10, 20]);
        let h = "a".repeat(64);
        fs::write(dir.path().join(format!("target-{h}")), b"memo").unwrap();
        fs::write(dir.path().join(format!("detected-cc-{h}")), b"memo!").unwrap();
        fs::write(dir.path().join(".tmp-abcdef"), b"123").unwrap();
        let cache = CompileCache::new(dir.path(), 1 << 30);
        let info = cache.info().unwrap();
        assert_eq!(
            info.objects,
            CacheFiles {
                count: 2,
                bytes: 30
            }
        );
        assert_eq!(info.memos, CacheFiles { count: 2, bytes: 9 });
        assert_eq!(info.temporary, CacheFiles { count: 1, bytes: 3 });
        assert_eq!(
            info.total(),
            CacheFiles {
                count: 5,
                bytes: 42
            }
        );
        assert_eq!(cache.clear().unwrap(), info.total());
        assert_eq!(cache.info().unwrap(), CacheInfo::default());
        others_are_intact(dir.path());
        // A missing directory is empty, and clearing it is a no-op.
        let gone = CompileCache::new(dir.path().join("nonexistent"), 1);
        assert_eq!(gone.info().unwrap(), CacheInfo::default());
        assert_eq!(gone.clear().unwrap(), CacheFiles::default());
        assert!(!dir.path().join("nonexistent").exists());
        // A cache "directory" that is a file is an error naming it.
        let file = CompileCache::new(dir.path().join("notes.txt"), 1);
        let e = file.info().unwrap_err().to_string();
        assert!(e.contains("notes.txt"), "{e}");
    }
}
