//! `write` calls whose data leaves as a Cap'n Proto segment of its own
//! (laid out in `segment.rs`), and the tests that a message so built is,
//! on the wire, the message a copy would have made.

use crate::capexec_capnp::process;
use crate::segment::{self, OutgoingBytes};

/// Sends `write(data, writeId)` on `process`, `data` taken whole as the
/// data field's own segment the first time it is sent (copied into the
/// message otherwise). Built and sent in one step: once it is the shared
/// segment, nothing may write the field again.
pub(crate) fn send_write(
    process: &process::Client,
    data: &OutgoingBytes,
    write_id: &str,
) -> capnp::capability::RemotePromise<process::write_results::Owned> {
    let mut request = process.write_request();
    // First, so that it lands in the message's first segment.
    request.get().set_write_id(write_id);
    // SAFETY: a request of capnp-rpc's.
    match unsafe { segment::send_with_data(request, data, "data") } {
        Ok(sent) => sent,
        Err(error) => unreachable!("`write` has a Data field `data`: {error}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capexec_capnp::process::write_params;

    /// Sets the data field of `params` to `data`, as `send_write` does.
    /// Returns whether the segment was taken.
    ///
    /// # Safety
    ///
    /// The field's last write: while the message lives, nothing sets,
    /// clears or initialises the field anew, nor the message's root.
    unsafe fn place_data(params: write_params::Builder<'_>, data: &OutgoingBytes) -> bool {
        let field = segment::data_field::<write_params::Owned>(params, "data").expect("data");
        // SAFETY: this function's contract.
        unsafe { segment::place_data(data, field) }
    }
    use crate::segment::SegmentBuffer;
    use bytes::{BufMut, Bytes};
    use capnp_rpc::rpc_capnp::message as rpc_message;

    fn laid_out(bytes: &[u8]) -> OutgoingBytes {
        let mut buffer = SegmentBuffer::with_capacity(bytes.len().max(256 * 1024));
        buffer.put_slice(bytes);
        buffer.freeze()
    }

    fn copied(bytes: &[u8]) -> OutgoingBytes {
        Bytes::copy_from_slice(bytes).into()
    }

    /// The message a `write` of `data` makes, as the connection writes it:
    /// a `Call` as capnp-rpc builds it, its target and capability table
    /// set at the send, after the parameters. With whether the segment was
    /// taken.
    fn on_the_wire(data: &OutgoingBytes, write_id: &str) -> (Vec<u8>, bool) {
        let mut message = capnp::message::Builder::new(capnp_rpc::MessageAllocator::new());
        let mut call = message.init_root::<rpc_message::Builder>().init_call();
        call.set_interface_id(1);
        call.set_method_id(1);
        let mut params: write_params::Builder = call
            .reborrow()
            .get_params()
            .expect("payload")
            .get_content()
            .init_as();
        params.set_write_id(write_id);
        // SAFETY: nothing writes the field or the root after this.
        let taken = unsafe { place_data(params, data) };
        call.reborrow()
            .get_target()
            .expect("target")
            .set_imported_cap(3);
        call.reborrow()
            .get_params()
            .expect("payload")
            .init_cap_table(0);
        call.set_question_id(7);
        let mut wire = Vec::new();
        capnp::serialize::write_message(&mut wire, &message).expect("write");
        (wire, taken)
    }

    /// The data and write id the message on `wire` carries.
    fn read_back(wire: &[u8]) -> (Vec<u8>, String) {
        let options = capnp::message::ReaderOptions {
            traversal_limit_in_words: None,
            nesting_limit: 64,
        };
        let message = capnp::serialize::read_message(&mut &wire[..], options).expect("read");
        let root = message.get_root::<rpc_message::Reader>().expect("root");
        let Ok(rpc_message::Call(call)) = root.which() else {
            panic!("not a call");
        };
        let params: write_params::Reader = call
            .expect("call")
            .get_params()
            .expect("payload")
            .get_content()
            .get_as()
            .expect("params");
        (
            params.get_data().expect("data").to_vec(),
            params
                .get_write_id()
                .expect("id")
                .to_string()
                .expect("utf-8"),
        )
    }

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 251) as u8 | 1).collect()
    }

    #[test]
    fn a_stdin_chunk_leaves_as_its_own_segment_byte_for_byte_as_a_copied_one() {
        // What `capexec run` lays out: 32 KiB to 256 KiB, ids `stdin-N`.
        let all = [
            32 * 1024,
            32 * 1024 + 1,
            100_001,
            131_075,
            256 * 1024 - 3,
            256 * 1024,
        ];
        // Under Miri (scripts/miri.sh) the two smallest only: the same
        // calls, in a minute less.
        let lens = if cfg!(miri) { &all[..2] } else { &all[..] };
        let pattern = pattern(lens[lens.len() - 1]);
        for &len in lens {
            for id in ["stdin-1", "stdin-123456789"] {
                let data = laid_out(&pattern[..len]);
                let (adopted, taken) = on_the_wire(&data, id);
                assert!(taken, "{len} bytes were copied into the message");
                assert!(
                    adopted == on_the_wire(&copied(&pattern[..len]), id).0,
                    "{len} bytes with id {id} differ on the wire"
                );
                assert_eq!(
                    read_back(&adopted),
                    (pattern[..len].to_vec(), id.to_string())
                );
                assert_eq!(data.as_slice(), &pattern[..len], "the shared bytes changed");
            }
        }
    }

    #[test]
    fn any_field_and_id_read_back_as_sent_whether_the_segment_is_taken_or_not() {
        // Other layouts than stdin's: where the call's other fields land
        // may differ from a copy's (a write id of about 8 KiB leaves the
        // first segment too full for the target, which a copy would put
        // in the spare room of the data's heap segment), but the message
        // reads back the same.
        let mut lens = vec![0, 1, 7, 8, 9, 2048, 8000];
        for base in [8 * 1024, 32 * 1024, 256 * 1024] {
            lens.extend((base - 9)..=(base + 8));
        }
        let mut ids = vec![0, 7, 8, 9, 100, 10 * 1024, 16 * 1024 + 8];
        ids.extend((8040..=8100).step_by(3));
        if cfg!(miri) {
            // 1,708 messages of up to 264 KiB: over 20 minutes under Miri. The
            // edges below 32 KiB, with an id that leaves the first segment room
            // for the target and one that does not.
            lens.retain(|&len| len <= 32 * 1024 + 1 && (len < 2048 || len % 8 <= 1));
            ids = vec![0, 9, 8040, 8100];
        }
        let pattern = pattern(lens.iter().copied().max().unwrap_or(0));
        let mut taken_count = 0;
        for &id_len in &ids {
            let id = "w".repeat(id_len);
            for &len in &lens {
                let data = laid_out(&pattern[..len]);
                let (wire, taken) = on_the_wire(&data, &id);
                taken_count += usize::from(taken);
                assert_eq!(read_back(&wire), (pattern[..len].to_vec(), id.clone()));
                assert_eq!(data.as_slice(), &pattern[..len], "the shared bytes changed");
            }
        }
        assert!(taken_count > 0);
    }

    #[test]
    fn bytes_are_offered_to_one_message_at_a_time_and_copied_meanwhile() {
        let pattern = vec![0x5a_u8; 40_000];
        let data = laid_out(&pattern);
        let kept = data.clone();
        // A message that holds the segment (as one on its way out does).
        let mut holding = capnp::message::Builder::new(capnp_rpc::MessageAllocator::new());
        let params = holding.init_root::<write_params::Builder>();
        // SAFETY: nothing writes the message after this.
        assert!(unsafe { place_data(params, &data) });
        let (copied_in, taken) = on_the_wire(&kept, "stdin-1");
        assert!(!taken);
        drop(holding);
        let (first, taken) = on_the_wire(&data, "stdin-1");
        assert!(taken);
        let (again, taken) = on_the_wire(&kept, "stdin-1");
        assert!(taken, "let go of with the message before");
        assert!(first == again && first == copied_in);
        assert_eq!(kept.as_slice(), &pattern[..]);
        assert!(!on_the_wire(&copied(b"not laid out"), "stdin-2").1);
    }

    #[test]
    fn a_field_that_fits_the_first_segment_leaves_the_offer_untaken_and_is_copied() {
        // 2 KiB fit the message's first segment, so no segment is
        // allocated while the offer stands, and the field is copied in.
        let pattern = vec![0xa5_u8; 2048];
        let (wire, taken) = on_the_wire(&laid_out(&pattern), "stdin-1");
        assert!(!taken);
        assert!(wire == on_the_wire(&copied(&pattern), "stdin-1").0);
    }

    #[test]
    #[should_panic(expected = "a segment offered while another stands")]
    fn an_offer_made_while_another_stands_is_refused() {
        let outer = laid_out(&[0x11_u8; 40_000]);
        let inner = laid_out(&[0x22_u8; 40_000]);
        let (outer, inner) = (
            outer.offer().expect("laid out"),
            inner.offer().expect("laid out"),
        );
        // SAFETY: neither build makes a field.
        unsafe {
            capnp_rpc::with_offered_segment(outer, || {
                capnp_rpc::with_offered_segment(inner, || ());
            })
        };
    }

    #[test]
    fn an_offer_is_withdrawn_when_the_build_it_stands_for_panics() {
        let data = laid_out(&[1_u8; 40_000]);
        let segment = data.offer().expect("laid out");
        let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // SAFETY: the build makes no field.
            unsafe { capnp_rpc::with_offered_segment(segment, || panic!("the build failed")) }
        }));
        assert!(built.is_err());
        // A field of the same size, built later with no offer standing,
        // lies in zeroed memory of the message's own, not in the bytes
        // offered before.
        let mut message = capnp::message::Builder::new(capnp_rpc::MessageAllocator::new());
        let mut params = message.init_root::<write_params::Builder>();
        let field = params.reborrow().init_data(40_000);
        assert!(field.iter().all(|&byte| byte == 0));
        assert!(!std::ptr::eq(field.as_ptr(), data.as_slice().as_ptr()));
    }

    #[test]
    fn only_a_data_field_outside_a_union_of_the_struct_named_is_found() {
        let mut message = capnp::message::Builder::new_default();
        let mut params = message.init_root::<write_params::Builder>();
        assert!(segment::data_field::<write_params::Owned>(params.reborrow(), "data").is_ok());
        for (name, why) in [("writeId", "not a Data field"), ("nothing", "")] {
            let found = segment::data_field::<write_params::Owned>(params.reborrow(), name);
            let error = found.err().expect(name).to_string();
            assert!(error.contains(why), "{name}: {error}");
        }
        let other = segment::data_field::<crate::capexec_capnp::output::Owned>(params, "data");
        assert!(
            other
                .err()
                .expect("another struct")
                .to_string()
                .contains("another struct")
        );
        let mut message = capnp::message::Builder::new_default();
        let value = message.init_root::<capnp::schema_capnp::value::Builder>();
        let member = segment::data_field::<capnp::schema_capnp::value::Owned>(value, "data");
        assert!(
            member
                .err()
                .expect("a union's")
                .to_string()
                .contains("a member of a union")
        );
    }
}
