//! The id of a cubecl managed memory handle (cubecl-runtime 0.10), which names a CUDA buffer.
//!
//! cubecl keeps the id private but prints it in the handle's `Debug` form
//! (`ManagedMemoryHandle { descriptor: ManagedMemoryDescriptor { id: ManagedMemoryId { value: N
//! }, .. }, .. }`). Views and in-place results hold clones of one handle, so they print the same
//! id. Always compiled (no GPU is needed to make a handle), so the test below runs everywhere.

/// The `value` of the first `ManagedMemoryId` in `memory`'s `Debug` form, or `None` when the
/// form holds none (a cubecl whose printing changed: the tracker then falls back to the view
/// rule for that tensor).
pub fn handle_id(memory: &impl std::fmt::Debug) -> Option<u64> {
    let text = format!("{memory:?}");
    let rest = &text[text.find("ManagedMemoryId")?..];
    let value = rest.find("value:")? + "value:".len();
    let digits: String = rest[value..]
        .trim_start()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use cubecl_runtime::server::Handle;

    fn stream() -> cubecl_common::stream_id::StreamId {
        cubecl_common::stream_id::StreamId { value: 0 }
    }

    #[test]
    fn views_share_the_id_and_new_handles_do_not() {
        let a = Handle::new(stream(), 4096);
        let view = a.clone().offset_start(1024);
        let b = Handle::new(stream(), 4096);
        let ia = handle_id(&a.memory).expect("cubecl prints the id");
        assert_eq!(
            handle_id(&view.memory),
            Some(ia),
            "a view holds the same handle"
        );
        assert_ne!(
            handle_id(&b.memory),
            Some(ia),
            "another handle has another id"
        );
        assert_eq!(handle_id(&"no id here"), None);
    }
}
