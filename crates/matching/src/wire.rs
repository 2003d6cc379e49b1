//! Little-endian field readers and writers for the tier's binary records (journal payloads,
//! snapshots). Every read is bounds-checked: a short or damaged buffer is an `Err` naming why,
//! never a panic. Public so that formats written beside the core's snapshots (the exchange's
//! journal payloads) read and write fields the same way.

/// Writes fields in order into a fixed-size payload, zeroing what is left unused.
pub struct Put<'a> {
    bytes: &'a mut [u8],
    at: usize,
}

impl<'a> Put<'a> {
    /// A writer over `bytes`, which it zeroes first so unused tails are deterministic.
    pub fn new(bytes: &'a mut [u8]) -> Put<'a> {
        bytes.fill(0);
        Put { bytes, at: 0 }
    }

    /// Appends `field`; a record larger than its declared payload size is a bug (panics).
    pub fn put(&mut self, field: &[u8]) {
        self.bytes[self.at..self.at + field.len()].copy_from_slice(field);
        self.at += field.len();
    }
}

/// Reads little-endian fields in order from a byte slice.
pub struct Fields<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Fields<'a> {
    /// A reader at the start of `bytes`.
    pub fn new(bytes: &'a [u8]) -> Fields<'a> {
        Fields { bytes, at: 0 }
    }

    /// The next `N` bytes; `Err` if fewer are left.
    pub fn take<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let field = self
            .bytes
            .get(self.at..self.at + N)
            .ok_or_else(|| format!("{} bytes are too short", self.bytes.len()))?;
        self.at += N;
        Ok(field.try_into().expect("slice of N bytes"))
    }

    /// The next byte.
    pub fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take::<1>()?[0])
    }

    /// The next little-endian `u32`.
    pub fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take()?))
    }

    /// The next little-endian `u64`.
    pub fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take()?))
    }

    /// The next little-endian `i64`.
    pub fn i64(&mut self) -> Result<i64, String> {
        Ok(i64::from_le_bytes(self.take()?))
    }

    /// The bytes not read yet.
    pub fn rest(&self) -> &'a [u8] {
        &self.bytes[self.at..]
    }
}
