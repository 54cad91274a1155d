//! Writing stories, the profile and the closing summary: one file per
//! format (`human`, `json`), each a [`Sink`]; and the traced packets for
//! Wireshark (`pcapng`, read back by `pcapng_read`).
//!
//! JSON lines schema (stable; fields are only ever added):
//! - `{"type":"story", ...Story}`: one per packet; see `story::Story`.
//! - `{"type":"profile", "steps": [...]}`: with `--profile`, at exit.
//! - `{"type":"probe", ...ProbeResult}`: with `--probe`, one per probe,
//!   after the stories.
//! - `{"type":"summary", ...Summary}`: one at exit.

mod human;
mod json;
pub mod pcapng;
pub mod pcapng_read;
pub mod plot;
pub mod schema;
mod sink;

use std::io::Write;

pub use human::{human_probe, human_profile, human_story, human_summary, Human};
pub use json::Json;
pub use sink::Sink;

use crate::model::Format;

/// The sink for `format`, writing to `out`.
pub fn sink<'a, W: Write + 'a>(format: Format, out: W, colour: bool) -> Box<dyn Sink + 'a> {
    match format {
        Format::Human => Box::new(Human { out, colour }),
        Format::Json => Box::new(Json::new(out)),
    }
}

/// Output kept for a test to read.
#[cfg(test)]
pub mod testing {
    use std::{cell::RefCell, io::Write, rc::Rc};

    #[derive(Clone, Default)]
    pub struct Kept(pub Rc<RefCell<Vec<u8>>>);

    impl Kept {
        pub fn text(&self) -> String {
            String::from_utf8_lossy(&self.0.borrow()).into_owned()
        }
    }

    impl Write for Kept {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.borrow_mut().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
}
