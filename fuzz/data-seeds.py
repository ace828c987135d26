#!/usr/bin/env python3
"""fuzz/data-seeds.py IMAGES_DIR DATA_DIR [IMAGE...]: seeds for fuzz-images
(TOYI, IDX plain and gzip, PNG/BMP written here, any image files given) and
fuzz-data (TOYT, loader options + state, SFT JSONL). Each seed is the mode
byte followed by the input."""
import gzip, os, struct, sys, zlib

img, dat = sys.argv[1], sys.argv[2]
os.makedirs(img, exist_ok=True)
os.makedirs(dat, exist_ok=True)
def put(d, name, b):
    open(os.path.join(d, name), "wb").write(b)

# TOYI: 3 images of 1x4x4, 2 classes
px = bytes(range(48))
put(img, "toyi", b"\0" + b"TOYI" + struct.pack("<6I", 1, 3, 1, 4, 4, 2) + struct.pack("<3I", 0, 1, 1) + px)
put(img, "toyi-rgb", b"\0" + b"TOYI" + struct.pack("<6I", 1, 1, 3, 2, 2, 3) + struct.pack("<I", 2) + bytes(12))
# IDX: 2 images of 3x3
im = struct.pack(">4I", 0x803, 2, 3, 3) + bytes(range(18))
lb = struct.pack(">2I", 0x801, 2) + bytes([3, 7])
put(img, "idx", b"\1" + struct.pack("<H", len(im)) + im + lb)
gi, gl = gzip.compress(im, mtime=0), gzip.compress(lb, mtime=0)
put(img, "idx-gz", b"\1" + struct.pack("<H", len(gi)) + gi + gl)
# PNG 3x2 RGB and gray+alpha, a BMP
def png(w, h, ctype, bpp, rows):
    def chunk(t, d): return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
    raw = b"".join(b"\0" + r for r in rows)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, ctype, 0, 0, 0)) + \
        chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
p1 = png(3, 2, 2, 3, [bytes(range(9)), bytes(range(9, 18))])
p2 = png(2, 2, 4, 2, [b"\x10\xff\x20\x80", b"\x30\x00\x40\xff"])
bmp_px = b"".join(bytes([x, x, x]) + b"\0" for x in (0, 80)) * 2  # 2x2, rows padded to 8 bytes
bmp = b"BM" + struct.pack("<IHHI", 54 + len(bmp_px), 0, 0, 54) + struct.pack("<IiiHHIIiiII", 40, 2, 2, 1, 24, 0, len(bmp_px), 0, 0, 0, 0) + bmp_px
for mode in (2, 6, 3, 7):
    put(img, "png-%d" % mode, bytes([mode]) + p1)
    put(img, "pnga-%d" % mode, bytes([mode]) + p2)
    put(img, "bmp-%d" % mode, bytes([mode]) + bmp)
for i, path in enumerate(sys.argv[3:]):
    b = open(path, "rb").read()
    if len(b) <= 32768:
        put(img, "file-%d-2" % i, b"\2" + b)
        put(img, "file-%d-7" % i, b"\7" + b)

# TOYT: 10 ids of vocab 300
toyt = b"TOYT" + struct.pack("<IIQ", 1, 300, 10) + struct.pack("<10I", *range(0, 300, 30))
put(dat, "toyt", b"\0" + toyt)
put(dat, "toyt-empty", b"\0" + b"TOYT" + struct.pack("<IIQ", 1, 5, 0))
state = bytes(88)
for opts in (b"\1\3\1\7", b"\0\7\4\0", b"\3\1\x09\2", b"\1\2\x2a\5"):
    put(dat, "loader-%s" % opts.hex(), b"\1" + opts + state + toyt)
sft = (b'{"prompt": "ab ab", "completion": "ba"}\n'
       b'\n'
       b'{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "ab"}]}\n'
       b'{"prompt": "", "completion": "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}\n')
for ctx in (7, 40, 200, 33):
    put(dat, "sft-%d" % ctx, b"\2" + bytes([ctx]) + sft)
print("image and data seeds written")
