//! The consumer framing decoder: any sequence of frames, cut into any chunks, decodes back to
//! the same frames; arbitrary bytes give frames or a reason, never a panic or a frame larger
//! than the bound; and the NATS batch decoder refuses what does not add up.

use delivery::wire::{
    BATCH_HEADER_BYTES, BATCH_VERSION, BatchHeader, DATA_FRAME_BYTES, FRAME_BYTES_MAX, Frame,
    FrameDecoder, RECORD_BYTES, Record, Stream, WireError, batch_range, batch_records,
    data_frame_head, decode_batch,
};
use proptest::prelude::*;

fn stream() -> impl Strategy<Value = Stream> {
    prop_oneof![Just(Stream::Reports), Just(Stream::MarketData)]
}

fn frame() -> impl Strategy<Value = Frame> {
    prop_oneof![
        any::<u8>().prop_map(|version| Frame::Hello { version }),
        (stream(), any::<u64>(), any::<u64>(), prop::collection::vec(any::<u8>(), RECORD_BYTES))
            .prop_map(|(stream, seq, received_abs_ns, bytes)| Frame::Data {
                stream,
                seq,
                received_abs_ns,
                record: Record(bytes.try_into().unwrap()),
            }),
        (stream(), any::<u64>(), any::<u64>()).prop_map(|(stream, first_seq, last_seq)| {
            Frame::Resync { stream, first_seq, last_seq }
        }),
        any::<u8>().prop_map(|reason| Frame::Goodbye { reason }),
    ]
}

proptest! {
    #[test]
    fn frames_survive_any_chunking(
        frames in prop::collection::vec(frame(), 0..20),
        cuts in prop::collection::vec(1usize..64, 1..50),
    ) {
        let mut bytes = Vec::new();
        for frame in &frames {
            frame.write(&mut bytes);
        }
        let mut decoder = FrameDecoder::default();
        let mut decoded = Vec::new();
        let (mut at, mut cut) = (0, 0);
        while at < bytes.len() {
            let end = (at + cuts[cut % cuts.len()]).min(bytes.len());
            decoder.extend(&bytes[at..end]);
            while let Some(frame) = decoder.next_frame().unwrap() {
                decoded.push(frame);
            }
            at = end;
            cut += 1;
        }
        prop_assert_eq!(decoded, frames);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let mut decoder = FrameDecoder::default();
        decoder.extend(&bytes);
        let mut frames = 0;
        // Each frame consumes at least a prefix and a type byte, so this ends.
        while let Ok(Some(_)) = decoder.next_frame() {
            frames += 1;
        }
        prop_assert!(frames <= bytes.len() / 5);
        let _ = decode_batch(&bytes);
        let _ = delivery::wire::RetainRequest::decode(&bytes);
    }

    /// Headers with the right version and any fields: a decoded batch's records are whole and
    /// numbered without overflow; anything else is a reason, never a panic.
    #[test]
    fn any_batch_header_decodes_or_is_refused(
        stream in 0u8..4,
        outlet in any::<u32>(),
        instance in any::<u64>(),
        first_seq in prop_oneof![any::<u64>(), Just(0), (u64::MAX - 300)..=u64::MAX],
        count in 0u16..300,
        extra in 0usize..3,
    ) {
        let mut bytes = vec![BATCH_VERSION, stream];
        bytes.extend_from_slice(&outlet.to_le_bytes());
        bytes.extend_from_slice(&instance.to_le_bytes());
        bytes.extend_from_slice(&first_seq.to_le_bytes());
        bytes.extend_from_slice(&count.to_le_bytes());
        bytes.resize(BATCH_HEADER_BYTES + count as usize * RECORD_BYTES + extra, 0);
        if let Ok((header, records)) = decode_batch(&bytes) {
            prop_assert_eq!(header.instance, instance);
            let seqs: Vec<u64> = batch_records(&header, records).map(|(seq, _)| seq).collect();
            prop_assert_eq!(seqs.len(), count as usize);
            prop_assert!(seqs.first().is_none_or(|&seq| seq == first_seq && seq > 0));
        }
    }

    #[test]
    fn batches_round_trip(
        count in 0usize..8,
        first_seq in 1u64..1 << 40,
        outlet in any::<u32>(),
        instance in any::<u64>(),
    ) {
        let header = BatchHeader { stream: Stream::MarketData, outlet, instance, epoch: 0, first_seq, count };
        let mut bytes = Vec::new();
        header.write(&mut bytes);
        bytes.extend(std::iter::repeat_n(7u8, count * RECORD_BYTES));
        let (decoded, records) = decode_batch(&bytes).unwrap();
        prop_assert_eq!(decoded, header);
        prop_assert_eq!(records.len(), count * RECORD_BYTES);
        // One byte more or less no longer adds up.
        bytes.push(0);
        prop_assert!(decode_batch(&bytes).is_err());
        prop_assert!(decode_batch(&bytes[..BATCH_HEADER_BYTES - 1]).is_err());
    }
}

#[test]
fn oversized_and_empty_lengths_are_refused() {
    for length in [0u32, FRAME_BYTES_MAX as u32 + 1, u32::MAX] {
        let mut decoder = FrameDecoder::default();
        decoder.extend(&length.to_le_bytes());
        assert!(decoder.next_frame().is_err(), "length {length} accepted");
    }
    let mut bad_version = Vec::new();
    BatchHeader {
        stream: Stream::Reports,
        outlet: 0,
        instance: 9,
        epoch: 0,
        first_seq: 1,
        count: 0,
    }
    .write(&mut bad_version);
    assert!(decode_batch(&bad_version).is_ok());
    for version in [BATCH_VERSION - 1, BATCH_VERSION + 1] {
        bad_version[0] = version;
        assert_eq!(decode_batch(&bad_version), Err(WireError::Version(version)));
    }
}

#[test]
fn batch_sequences_that_start_at_zero_or_overflow_are_refused() {
    for (first_seq, count) in [(0, 0), (0, 1), (u64::MAX, 1), (u64::MAX - 2, 3)] {
        let bytes = numbered_batch(first_seq, count);
        assert_eq!(
            decode_batch(&bytes),
            Err(WireError::Sequence(first_seq)),
            "{first_seq}+{count}"
        );
    }
    // The last sequence that fits is accepted, and `batch_records` numbers it without overflow.
    let bytes = numbered_batch(u64::MAX - 2, 2);
    let (decoded, records) = decode_batch(&bytes).unwrap();
    let seqs: Vec<u64> = batch_records(&decoded, records).map(|(seq, _)| seq).collect();
    assert_eq!(seqs, [u64::MAX - 2, u64::MAX - 1]);
}

/// A batch of `count` records from `first_seq`, each record's first byte its index.
fn numbered_batch(first_seq: u64, count: usize) -> Vec<u8> {
    let header =
        BatchHeader { stream: Stream::Reports, outlet: 0, instance: 1, epoch: 0, first_seq, count };
    let mut bytes = Vec::new();
    header.write(&mut bytes);
    for index in 0..count {
        let mut record = [0u8; RECORD_BYTES];
        record[0] = index as u8;
        bytes.extend_from_slice(&record);
    }
    bytes
}

#[test]
fn a_batch_range_is_the_records_of_the_asked_sequences() {
    let bytes = numbered_batch(10, 5); // sequences 10..=14
    let (header, records) = decode_batch(&bytes).unwrap();
    let firsts = |range: &[u8]| range.chunks(RECORD_BYTES).map(|r| r[0]).collect::<Vec<_>>();
    let cases = [
        ((0, u64::MAX), (10, vec![0, 1, 2, 3, 4])),
        ((12, u64::MAX), (12, vec![2, 3, 4])),
        ((11, 12), (11, vec![1, 2])),
        ((14, 20), (14, vec![4])),
        ((15, 20), (15, vec![])),
        ((3, 9), (10, vec![])),
    ];
    for ((from, last), (first, expected)) in cases {
        let (got_first, range) = batch_range(&header, records, from, last);
        assert_eq!((got_first, firsts(range)), (first, expected), "{from}..={last}");
    }
}

#[test]
fn a_data_frame_head_and_its_record_are_the_data_frame() {
    let record = Record([7; RECORD_BYTES]);
    let mut written = Vec::new();
    Frame::Data { stream: Stream::MarketData, seq: 42, received_abs_ns: 9, record }
        .write(&mut written);
    let mut assembled = data_frame_head(Stream::MarketData, 42, 9).to_vec();
    assembled.extend_from_slice(&record.0);
    assert_eq!(assembled, written);
    assert_eq!(written.len(), DATA_FRAME_BYTES);
}
