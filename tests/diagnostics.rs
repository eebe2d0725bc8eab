//! Library diagnostics through the `tracing` crate: a user's own subscriber sees compiles
//! (with cache hits and misses) and links.

mod common;

use arrayjit::ir::*;
use common::*;
use std::sync::{Arc, Mutex};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

/// A minimal subscriber recording `target: message` of every event.
#[derive(Clone, Default)]
struct Collect(Arc<Mutex<Vec<String>>>);

struct Message(String);
impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl Subscriber for Collect {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, e: &Event<'_>) {
        let mut m = Message(String::new());
        e.record(&mut m);
        self.0
            .lock()
            .unwrap()
            .push(format!("{}: {}", e.metadata().target(), m.0));
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

#[test]
fn compiles_cache_hits_and_links_are_reported() {
    let cache = tempfile::tempdir().unwrap();
    let mut cfg = arrayjit::compile::CompilerConfig::from_env().unwrap();
    cfg.cache_dir = Some(cache.path().to_path_buf());
    let collect = Collect::default();
    tracing::subscriber::with_default(collect.clone(), || {
        for _ in 0..2 {
            let jit =
                arrayjit::Jit::new(arrayjit::JitConfig::default().compiler(Some(cfg.clone())))
                    .unwrap();
            let x = input("x", &[3], Prec::Single, &[1., 2., 3.]);
            let y = output("y", &[3], Prec::Single);
            let b = Bindings::empty();
            let code = jit
                .compile(
                    "diag",
                    &b,
                    &unop(&y, Binop::Arg2, false, Unop::Neg, &x, "i->i", &b),
                )
                .unwrap();
            let dev = jit.device().unwrap();
            jit.link(&jit.context(&dev).unwrap(), &code).unwrap();
        }
    });
    let seen = collect.0.lock().unwrap().clone();
    let count = |s: &str| seen.iter().filter(|e| e.contains(s)).count();
    assert_eq!(
        count("arrayjit::compile: compiled (cache miss)"),
        1,
        "{seen:?}"
    );
    assert_eq!(count("arrayjit::compile: cache hit"), 1, "{seen:?}");
    assert_eq!(count("arrayjit::backend: linked"), 2, "{seen:?}");
}
