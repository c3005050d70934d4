//! Labels: cheap caller-supplied names attached to allocations (e.g. `"activation"`).

use std::sync::Arc;

/// A caller-supplied name for an allocation, kept in snapshots and trace entries.
///
/// Cloning is cheap: a `&'static str` is copied, a shared string bumps a reference count.
/// Build one with `Label::from("activation")` (static) or `Label::from(String)` / `Arc<str>`.
/// Labels compare and hash by their text, however they were built.
#[derive(Clone, Debug)]
pub struct Label(Repr);

#[derive(Clone, Debug)]
enum Repr {
    Static(&'static str),
    Shared(Arc<str>),
}

impl Label {
    /// A label from a static string (no allocation).
    pub const fn new_static(s: &'static str) -> Self {
        Label(Repr::Static(s))
    }

    /// The label's text.
    pub fn as_str(&self) -> &str {
        match &self.0 {
            Repr::Static(s) => s,
            Repr::Shared(s) => s,
        }
    }
}

impl PartialEq for Label {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Label {}

impl std::hash::Hash for Label {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl From<&'static str> for Label {
    fn from(s: &'static str) -> Self {
        Label(Repr::Static(s))
    }
}

impl From<String> for Label {
    fn from(s: String) -> Self {
        Label(Repr::Shared(Arc::from(s)))
    }
}

impl From<Arc<str>> for Label {
    fn from(s: Arc<str>) -> Self {
        Label(Repr::Shared(s))
    }
}

impl std::ops::Deref for Label {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl std::fmt::Display for Label {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for Label {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for Label {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Label::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_compare_by_text_source() {
        let a = Label::from("activation");
        let b = Label::from(String::from("activation"));
        assert_eq!(a.as_str(), b.as_str());
        assert_eq!(a, b);
        let back: Label = serde_json::from_str("\"activation\"").unwrap();
        assert_eq!(back, a);
        assert_eq!(a.to_string(), "activation");
        assert_eq!(serde_json::to_string(&b).unwrap(), "\"activation\"");
    }
}
