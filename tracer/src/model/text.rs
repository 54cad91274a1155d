//! Text helpers that rule readers of several layers share.

/// Splits on spaces, keeping "double-quoted words" together (as
/// iptables-save quotes a comment).
pub fn shell_words(text: &str) -> Vec<String> {
    let mut words = vec![String::new()];
    let mut quoted = false;
    for c in text.chars() {
        match c {
            '"' => quoted = !quoted,
            ' ' if !quoted => words.push(String::new()),
            c => words.last_mut().expect("one").push(c),
        }
    }
    words.retain(|w| !w.is_empty());
    words
}
