//! The compile cache: shared objects stored under a key, checked before use.
//!
//! The key is a BLAKE3 hash (64 hexadecimal digits) of the C source, the runtime header, the full compiler command, the
//! compiler's identity (resolved path, size, modification time) and the
//! [`Target::fingerprint`] (what the compiler makes of the architecture flags on this
//! machine). The key is also compiled into the object, as the exported array
//! `arrayjit_cache_key_<key>` holding the key (appended to the source that is compiled, not
//! to the source the key is computed from), and the stored file ends with a trailer that the
//! loader ignores: the key, the object's BLAKE3 checksum and a magic number.
//!
//! A cache entry is only opened if its trailer names its key and its checksum matches (so a
//! truncated, damaged or foreign file is never handed to `dlopen`), and only used if the
//! loaded object's symbol holds the key; anything else (another program's library copied over
//! the entry, another entry, a truncated or garbage file) is deleted and compiled again.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use super::config::{program_identity, CompilerConfig};
use super::load::{open_library, symbol_address, Handle};
use super::target::Target;
use super::{hash_hex, RUNTIME_HEADER};

/// One cache entry: `<cache dir>/<key>.so`.
pub(super) struct CacheEntry {
    /// The entry's path.
    pub path: PathBuf,
    /// The key (64 hexadecimal digits).
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
        let key = hash_hex(&[
            b"arrayjit-cache-v3",
            config.compiler.as_os_str().as_encoded_bytes(),
            identity.as_bytes(),
            command.as_bytes(),
            RUNTIME_HEADER.as_bytes(),
            target.fingerprint.as_bytes(),
            source.as_bytes(),
        ]);
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
        drop(bytes);
        let sym = self.symbol();
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
    /// file, and appends the trailer. Failures only cost the cache entry.
    pub(super) fn store(&self, built: &Path) {
        let Some(dir) = self.path.parent() else {
            return;
        };
        let Ok(mut object) = fs::read(built) else {
            return;
        };
        if fs::create_dir_all(dir).is_err() {
            return;
        }
        let Ok(mut tmp) = tempfile::Builder::new().prefix(".tmp-").tempfile_in(dir) else {
            return;
        };
        let sum = checksum(&object);
        object.extend_from_slice(self.key.as_bytes());
        object.extend_from_slice(&sum);
        object.extend_from_slice(TRAILER_MAGIC);
        if tmp.write_all(&object).is_ok() {
            let _ = tmp.persist(&self.path);
        }
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
            path: dir.path().join(format!("{key}.so")),
            key: key.clone(),
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
            &format!("int f(void) {{ return 1; }}\n{}", entry.marker()),
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
}
