//! The compile cache: shared objects stored under a key, checked before use.
//!
//! The key is a hash of the C source, the runtime header, the full compiler command, the
//! compiler's identity (resolved path, size, modification time) and the
//! [`Target::fingerprint`] (what the compiler makes of the architecture flags on this
//! machine). The key is also compiled into the object, as the exported array
//! `arrayjit_cache_key_<key>` holding the key (appended to the source that is compiled, not
//! to the source the key is computed from). A cache entry is only used if it is an ELF file
//! that carries that symbol, loads, and whose symbol holds the key; anything else (another
//! program's library copied over the entry, a truncated or garbage file) is deleted and
//! compiled again.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::config::{program_identity, CompilerConfig};
use super::load::{open_library, symbol_address, Handle};
use super::target::Target;
use super::{fnv128, RUNTIME_HEADER};

/// One cache entry: `<cache dir>/<key>.so`.
pub(super) struct CacheEntry {
    /// The entry's path.
    pub path: PathBuf,
    /// The key (32 hexadecimal digits).
    key: String,
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
    /// The entry for compiling `source` with `command` under `config` for `target`, or `None`
    /// when the compiler cannot be identified (then the cache is bypassed rather than risk
    /// reusing another compiler's output).
    pub(super) fn new(
        dir: &Path,
        config: &CompilerConfig,
        source: &str,
        command: &str,
        target: &Target,
    ) -> Option<CacheEntry> {
        let identity = program_identity(&config.compiler)?;
        let h = fnv128(&[
            b"arrayjit-cache-v2",
            config.compiler.as_os_str().as_encoded_bytes(),
            identity.as_bytes(),
            command.as_bytes(),
            RUNTIME_HEADER.as_bytes(),
            target.fingerprint.as_bytes(),
            source.as_bytes(),
        ]);
        let key = format!("{h:032x}");
        Some(CacheEntry {
            path: dir.join(format!("{key}.so")),
            key,
        })
    }

    /// The name of the symbol that carries the key in the object.
    fn symbol(&self) -> String {
        format!("arrayjit_cache_key_{}", self.key)
    }

    /// The C text appended to the source that is compiled for this entry: an exported,
    /// always-kept array named after the key and holding it.
    pub(super) fn marker(&self) -> String {
        let sym = self.symbol();
        format!(
            "\n/* arrayjit compile cache key */\n\
             extern const char {sym}[];\n\
             __attribute__((visibility(\"default\"), used)) const char {sym}[] = \"{}\";\n",
            self.key
        )
    }

    /// Looks the entry up. An entry that exists but is not this key's object is deleted.
    pub(super) fn lookup(&self) -> Lookup {
        let bytes = match fs::read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Lookup::Miss,
            Err(e) => return self.discard(format!("cannot be read: {e}")),
        };
        if !bytes.starts_with(b"\x7fELF") {
            return self.discard("is not an ELF file".into());
        }
        let sym = self.symbol();
        if !contains(&bytes, sym.as_bytes()) {
            return self.discard(format!("does not carry the symbol {sym}"));
        }
        drop(bytes);
        let lib = match open_library(&self.path) {
            Ok(lib) => lib,
            Err(e) => return self.discard(format!("cannot be loaded: {e}")),
        };
        let addr = match symbol_address(&lib, &sym) {
            Ok(a) => a,
            Err(msg) => {
                drop(lib);
                return self.discard(msg);
            }
        };
        let expected = format!("{}\0", self.key);
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
        Lookup::Hit(lib)
    }

    /// Deletes an invalid entry (failures only mean it is overwritten later).
    fn discard(&self, why: String) -> Lookup {
        let _ = fs::remove_file(&self.path);
        Lookup::Discarded(format!("cache entry {} {why}", self.path.display()))
    }

    /// Copies a freshly built library into the cache atomically (a temporary file in the cache
    /// directory, then a rename), so a concurrent reader sees either nothing or the whole
    /// file. Failures only cost the cache entry.
    pub(super) fn store(&self, built: &Path) {
        let Some(dir) = self.path.parent() else {
            return;
        };
        if fs::create_dir_all(dir).is_err() {
            return;
        }
        let Ok(tmp) = tempfile::Builder::new().prefix(".tmp-").tempfile_in(dir) else {
            return;
        };
        if fs::copy(built, tmp.path()).is_ok() {
            let _ = tmp.persist(&self.path);
        }
    }
}

/// Whether `haystack` contains `needle`.
fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    let Some((&first, _)) = needle.split_first() else {
        return true;
    };
    haystack
        .iter()
        .enumerate()
        .filter(|(_, &b)| b == first)
        .any(|(i, _)| haystack[i..].starts_with(needle))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn substring_search() {
        assert!(contains(b"abcabd", b"abd"));
        assert!(!contains(b"abcab", b"abd"));
        assert!(contains(b"x", b""));
        assert!(!contains(b"", b"x"));
    }
}
