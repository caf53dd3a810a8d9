//! The hash slot of a key (Redis Cluster's CRC16 of the key or of its `{hash tag}`, modulo
//! 16384), pure. The replication glue (`server/ffi/replication.rs`) groups what it sends
//! by slot in cluster mode: a slot migration streams to the new owner only what names a
//! key of the moving slot.

/// Slots in a cluster.
pub const SLOTS: u16 = 16384;

/// CRC16/XMODEM (polynomial 0x1021), as the cluster specification defines it.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The part of a key that is hashed: what lies between the first `{` and the first `}`
/// after it, when that is not empty; else the whole key.
fn hashed_part(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&b| b == b'{') {
        if let Some(len) = key[open + 1..].iter().position(|&b| b == b'}') {
            if len > 0 {
                return &key[open + 1..open + 1 + len];
            }
        }
    }
    key
}

/// The hash slot of `key`.
pub fn key_slot(key: &[u8]) -> u16 {
    crc16(hashed_part(key)) % SLOTS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_hashes_keys_as_redis_cluster_does() {
        // Expected values from CLUSTER KEYSLOT.
        let table: [(&[u8], u16); 8] = [
            (b"123456789", 12739), // the specification's check value 0x31C3
            (b"foo", 12182),
            (b"lock:0", 7495),
            (b"{user1000}.following", 3443),
            (b"{user1000}.followers", 3443),
            (b"foo{}{bar}", 8363),    // an empty tag: the whole key
            (b"foo{{bar}}zap", 4015), // the tag is "{bar"
            (b"", 0),
        ];
        for (key, slot) in table {
            assert_eq!(key_slot(key), slot, "{}", String::from_utf8_lossy(key));
        }
    }
}
