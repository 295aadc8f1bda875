"""squeeze's gate: the candidate's constants give a stream that round-trips (a bad constant fails here, clearly)."""

import unittest
import zlib

import compressor


class CompressorTest(unittest.TestCase):
    def test_round_trip(self):
        for data in (b"", b"a", b"the quick brown fox " * 500, bytes(range(256)) * 40):
            self.assertEqual(zlib.decompress(compressor.compress(data)), data)


if __name__ == "__main__":
    unittest.main()
