#!/usr/bin/python3
"""gen-quant-refs.py: reference vectors for tests/test-quant.c.

An independent, deliberately slow transcription of ggml's reference
quantizers (ggml-quants.c quantize_row_*_ref) and dequantizers in numpy,
doing every float32 operation one at a time with np.float32 scalars, in
ggml's order, so that the C code in src/core/quant.c can be compared
bit for bit. f16 rounding is numpy's float32 -> float16 conversion
(round to nearest even, with subnormals), the same as ggml's.

Writes tests/data/quant-refs.bin:
  "TQR1", u32 n_cases, then per case:
  u32 kind (0 = quantize, 1 = dequantize), u32 ggml type, u32 n elements,
  kind 0: f32 x[n], u32 nbytes, u8 expected[nbytes]
  kind 1: u32 nbytes, u8 blocks[nbytes], f32 expected[n]
Run: /usr/bin/python3 tests/quant/gen-quant-refs.py  (from the repo root)
"""
import ctypes
import ctypes.util
import math
import struct
import sys

import numpy as np

F = np.float32
QK_K = 256


def f16(x):
    return np.array([F(x)], dtype=np.float32).astype(np.float16)


def f16_bytes(x):
    return f16(x).tobytes()


def f16_val(b):
    return F(np.frombuffer(b, dtype=np.float16)[0])


def nearest_int(f):
    # ggml's magic-number rounding = round half to even for |f| < 2^22
    return int(round(float(f)))


def trunc_int(f):
    return int(math.trunc(float(f)))


def roundf(f):
    v = math.floor(abs(float(f)) + 0.5)
    return int(math.copysign(v, float(f)))


# ---- legacy quantizers ---------------------------------------------------------

def q8_0(x):
    out = b""
    for i in range(0, len(x), 32):
        b = x[i:i + 32]
        amax = F(0)
        for v in b:
            amax = max(amax, F(abs(v)))
        d = F(amax / F(127))
        idv = F(F(1) / d) if d != 0 else F(0)
        out += f16_bytes(d)
        out += bytes((roundf(F(v * idv)) & 0xFF) for v in b)
    return out


def q4_0(x, nbits=4):
    half = 8 if nbits == 4 else 16
    out = b""
    for i in range(0, len(x), 32):
        b = x[i:i + 32]
        amax = F(0)
        mx = F(0)
        for v in b:
            if amax < F(abs(v)):
                amax = F(abs(v))
                mx = v
        d = F(mx / F(-half))
        idv = F(F(1) / d) if d != 0 else F(0)
        out += f16_bytes(d)
        qs = []
        qh = 0
        top = 15 if nbits == 4 else 31
        for j in range(16):
            x0 = F(b[j] * idv)
            x1 = F(b[j + 16] * idv)
            q0 = min(top, trunc_int(F(x0 + F(half + 0.5))))
            q1 = min(top, trunc_int(F(x1 + F(half + 0.5))))
            qs.append((q0 & 0xF) | ((q1 & 0xF) << 4))
            qh |= ((q0 & 0x10) >> 4) << j
            qh |= ((q1 & 0x10) >> 4) << (j + 16)
        if nbits == 5:
            out += struct.pack("<I", qh)
        out += bytes(qs)
    return out


def q4_1(x, nbits=4):
    out = b""
    top = (1 << nbits) - 1
    for i in range(0, len(x), 32):
        b = x[i:i + 32]
        mn = F(np.finfo(np.float32).max)
        mx = F(-np.finfo(np.float32).max)
        for v in b:
            if v < mn:
                mn = v
            if v > mx:
                mx = v
        d = F(F(mx - mn) / F(top))
        idv = F(F(1) / d) if d != 0 else F(0)
        out += f16_bytes(d) + f16_bytes(mn)
        qs = []
        qh = 0
        for j in range(16):
            x0 = F(F(b[j] - mn) * idv)
            x1 = F(F(b[j + 16] - mn) * idv)
            q0 = trunc_int(F(x0 + F(0.5)))
            q1 = trunc_int(F(x1 + F(0.5)))
            if nbits == 4:
                q0, q1 = min(15, q0), min(15, q1)
            qs.append((q0 & 0xF) | ((q1 & 0xF) << 4))
            qh |= ((q0 & 0x10) >> 4) << j
            qh |= ((q1 & 0x10) >> 4) << (j + 16)
        if nbits == 5:
            out += struct.pack("<I", qh)
        out += bytes(qs)
    return out


# ---- k-quants ------------------------------------------------------------------------

def make_qkx2(x, w, nmax, rmin, rdelta, nstep, use_mad=False):
    n = len(x)
    mn = x[0]
    mx = x[0]
    sum_w = w[0]
    sum_x = F(sum_w * x[0])
    for i in range(1, n):
        if x[i] < mn:
            mn = x[i]
        if x[i] > mx:
            mx = x[i]
        sum_w = F(sum_w + w[i])
        sum_x = F(sum_x + F(w[i] * x[i]))
    if mn > 0:
        mn = F(0)
    if mx == mn:
        return F(0), F(-mn), [0] * n
    iscale = F(F(nmax) / F(mx - mn))
    scale = F(F(1) / iscale)
    L = []
    best = F(0)
    for i in range(n):
        l = nearest_int(F(iscale * F(x[i] - mn)))
        l = max(0, min(nmax, l))
        L.append(l)
        diff = F(F(F(scale * F(l)) + mn) - x[i])
        diff = F(abs(diff)) if use_mad else F(diff * diff)
        best = F(best + F(w[i] * diff))
    for is_ in range(nstep + 1):
        iscale = F(F(F(rmin + F(rdelta * F(is_))) + F(nmax)) / F(mx - mn))
        sum_l = F(0)
        sum_l2 = F(0)
        sum_xl = F(0)
        Laux = []
        for i in range(n):
            l = nearest_int(F(iscale * F(x[i] - mn)))
            l = max(0, min(nmax, l))
            Laux.append(l)
            wl = F(w[i] * F(l))
            sum_l = F(sum_l + wl)
            sum_l2 = F(sum_l2 + F(wl * F(l)))
            sum_xl = F(sum_xl + F(wl * x[i]))
        D = F(F(sum_w * sum_l2) - F(sum_l * sum_l))
        if D > 0:
            this_scale = F(F(F(sum_w * sum_xl) - F(sum_x * sum_l)) / D)
            this_min = F(F(F(sum_l2 * sum_x) - F(sum_l * sum_xl)) / D)
            if this_min > 0:
                this_min = F(0)
                this_scale = F(sum_xl / sum_l2)
            err = F(0)
            for i in range(n):
                diff = F(F(F(this_scale * F(Laux[i])) + this_min) - x[i])
                diff = F(abs(diff)) if use_mad else F(diff * diff)
                err = F(err + F(w[i] * diff))
            if err < best:
                L = list(Laux)
                best = err
                scale = this_scale
                mn = this_min
    return scale, F(-mn), L


def scale_min_k4(j, q):
    if j < 4:
        return q[j] & 63, q[j + 4] & 63
    return (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4)


def kquant(x, nmax, rmin, nstep):
    L = [0] * QK_K
    scales = []
    mins = []
    max_scale = F(0)
    max_min = F(0)
    for j in range(8):
        xs = x[32 * j:32 * j + 32]
        sum_x2 = F(0)
        for v in xs:
            sum_x2 = F(sum_x2 + F(v * v))
        av_x = F(np.sqrt(F(sum_x2 / F(32))))
        w = [F(av_x + F(abs(v))) for v in xs]
        s, m, Ls = make_qkx2(xs, w, nmax, F(rmin), F(0.1), nstep)
        L[32 * j:32 * j + 32] = Ls
        scales.append(s)
        mins.append(m)
        if s > max_scale:
            max_scale = s
        if m > max_min:
            max_min = m
    inv_scale = F(F(63) / max_scale) if max_scale > 0 else F(0)
    inv_min = F(F(63) / max_min) if max_min > 0 else F(0)
    sc = [0] * 12
    for j in range(8):
        ls = min(63, nearest_int(F(inv_scale * scales[j])) & 0xFF)
        lm = min(63, nearest_int(F(inv_min * mins[j])) & 0xFF)
        if j < 4:
            sc[j] = ls
            sc[j + 4] = lm
        else:
            sc[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4)
            sc[j - 4] |= (ls >> 4) << 6
            sc[j] |= (lm >> 4) << 6
    dbytes = f16_bytes(F(max_scale / F(63)))
    mbytes = f16_bytes(F(max_min / F(63)))
    dd = f16_val(dbytes)
    dmin = f16_val(mbytes)
    for j in range(8):
        s, m = scale_min_k4(j, sc)
        d = F(dd * F(s))
        if d == 0:
            continue
        dm = F(dmin * F(m))
        for ii in range(32):
            l = nearest_int(F(F(x[32 * j + ii] + dm) / d))
            L[32 * j + ii] = max(0, min(nmax, l))
    return dbytes + mbytes + bytes(sc), L


def q4_k(x):
    out = b""
    for i in range(0, len(x), QK_K):
        hdr, L = kquant(x[i:i + QK_K], 15, -1.0, 20)
        qs = []
        for j in range(0, QK_K, 64):
            qs += [L[j + l] | (L[j + l + 32] << 4) for l in range(32)]
        out += hdr + bytes(qs)
    return out


def q5_k(x):
    out = b""
    for i in range(0, len(x), QK_K):
        hdr, L = kquant(x[i:i + QK_K], 31, -0.5, 15)
        qh = [0] * 32
        ql = []
        m1, m2 = 1, 2
        for n in range(0, QK_K, 64):
            for j in range(32):
                l1, l2 = L[n + j], L[n + j + 32]
                if l1 > 15:
                    l1 -= 16
                    qh[j] |= m1
                if l2 > 15:
                    l2 -= 16
                    qh[j] |= m2
                ql.append(l1 | (l2 << 4))
            m1 <<= 2
            m2 <<= 2
        out += hdr + bytes(qh) + bytes(ql)
    return out


def make_qx(x, nmax):
    n = len(x)
    mx = F(0)
    amax = F(0)
    for v in x:
        if F(abs(v)) > amax:
            amax = F(abs(v))
            mx = v
    if amax < F(1e-15):
        return F(0), [0] * n
    iscale = F(F(-nmax) / mx)
    sumlx = F(0)
    suml2 = F(0)
    L = []
    for v in x:
        l = max(-nmax, min(nmax - 1, nearest_int(F(iscale * v))))
        L.append(l + nmax)
        w = F(v * v)
        sumlx = F(sumlx + F(F(w * v) * F(l)))
        suml2 = F(suml2 + F(F(w * F(l)) * F(l)))
    scale = F(sumlx / suml2) if suml2 != 0 else F(0)
    best = F(scale * sumlx)
    for is_ in range(-9, 10):
        if is_ == 0:
            continue
        iscale = F(F(-F(F(nmax) + F(F(0.1) * F(is_)))) / mx)
        sumlx = F(0)
        suml2 = F(0)
        for v in x:
            l = max(-nmax, min(nmax - 1, nearest_int(F(iscale * v))))
            w = F(v * v)
            sumlx = F(sumlx + F(F(w * v) * F(l)))
            suml2 = F(suml2 + F(F(w * F(l)) * F(l)))
        if suml2 > 0 and F(sumlx * sumlx) > F(best * suml2):
            L = [nmax + max(-nmax, min(nmax - 1, nearest_int(F(iscale * v)))) for v in x]
            scale = F(sumlx / suml2)
            best = F(scale * sumlx)
    return scale, L


def pack_pairs(L):
    qs = []
    for j in range(0, QK_K, 128):
        qs += [L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6) for l in range(32)]
    return bytes(qs)


def q2_k(x):
    out = b""
    for i in range(0, len(x), QK_K):
        xb = x[i:i + QK_K]
        L = [0] * QK_K
        scales, mins = [], []
        max_scale = F(0)
        max_min = F(0)
        for j in range(16):
            xs = xb[16 * j:16 * j + 16]
            w = [F(abs(v)) for v in xs]
            s_, m_, Ls = make_qkx2(xs, w, 3, F(-0.5), F(0.1), 15, use_mad=True)
            L[16 * j:16 * j + 16] = Ls
            scales.append(s_)
            mins.append(m_)
            if s_ > max_scale:
                max_scale = s_
            if m_ > max_min:
                max_min = m_
        sc = [0] * 16
        if max_scale > 0:
            iscale = F(F(15) / max_scale)
            sc = [nearest_int(F(iscale * v)) for v in scales]
            dbytes = f16_bytes(F(max_scale / F(15)))
        else:
            dbytes = f16_bytes(F(0))
        if max_min > 0:
            iscale = F(F(15) / max_min)
            sc = [sc[j] | (nearest_int(F(iscale * mins[j])) << 4) for j in range(16)]
            mbytes = f16_bytes(F(max_min / F(15)))
        else:
            mbytes = f16_bytes(F(0))
        dd, dmin = f16_val(dbytes), f16_val(mbytes)
        for j in range(16):
            d = F(dd * F(sc[j] & 0xF))
            if d == 0:
                continue
            dm = F(dmin * F(sc[j] >> 4))
            for ii in range(16):
                l = nearest_int(F(F(xb[16 * j + ii] + dm) / d))
                L[16 * j + ii] = max(0, min(3, l))
        out += bytes(sc) + pack_pairs(L) + dbytes + mbytes
    return out


def make_q3(x, nmax):
    n = len(x)
    mx = F(0)
    amax = F(0)
    for v in x:
        if F(abs(v)) > amax:
            amax = F(abs(v))
            mx = v
    if amax < F(1e-15):
        return F(0), [0] * n
    iscale = F(F(-nmax) / mx)
    sumlx = F(0)
    suml2 = F(0)
    L = []
    for v in x:
        l = max(-nmax, min(nmax - 1, nearest_int(F(iscale * v))))
        L.append(l)
        w = F(v * v)
        sumlx = F(sumlx + F(F(w * v) * F(l)))
        suml2 = F(suml2 + F(F(w * F(l)) * F(l)))
    for _ in range(5):
        changed = 0
        for i in range(n):
            v = x[i]
            w = F(v * v)
            slx = F(sumlx - F(F(w * v) * F(L[i])))
            if slx > 0:
                sl2 = F(suml2 - F(F(w * F(L[i])) * F(L[i])))
                nl = max(-nmax, min(nmax - 1, nearest_int(F(F(v * sl2) / slx))))
                if nl != L[i]:
                    slx = F(slx + F(F(w * v) * F(nl)))
                    sl2 = F(sl2 + F(F(w * F(nl)) * F(nl)))
                    if sl2 > 0 and F(F(slx * slx) * suml2) > F(F(sumlx * sumlx) * sl2):
                        L[i] = nl
                        sumlx = slx
                        suml2 = sl2
                        changed += 1
        if not changed:
            break
    return F(sumlx / suml2), [l + nmax for l in L]


def q3_k(x):
    out = b""
    for i in range(0, len(x), QK_K):
        xb = x[i:i + QK_K]
        L = [0] * QK_K
        scales = []
        max_scale = F(0)
        amax = F(0)
        for j in range(16):
            s_, Ls = make_q3(xb[16 * j:16 * j + 16], 4)
            L[16 * j:16 * j + 16] = Ls
            scales.append(s_)
            if F(abs(s_)) > amax:
                amax = F(abs(s_))
                max_scale = s_
        sc = [0] * 12
        if max_scale != 0:
            iscale = F(F(-32) / max_scale)
            for j in range(16):
                l = max(-32, min(31, nearest_int(F(iscale * scales[j])))) + 32
                if j < 8:
                    sc[j] = l & 0xF
                else:
                    sc[j - 8] |= (l & 0xF) << 4
                sc[j % 4 + 8] |= (l >> 4) << (2 * (j // 4))
            dbytes = f16_bytes(F(F(1) / iscale))
        else:
            dbytes = f16_bytes(F(0))
        dd = f16_val(dbytes)
        for j in range(16):
            lo = sc[j] & 0xF if j < 8 else sc[j - 8] >> 4
            v6 = (lo | (((sc[8 + j % 4] >> (2 * (j // 4))) & 3) << 4)) - 32
            d = F(dd * F(v6))
            if d == 0:
                continue
            for ii in range(16):
                l = max(-4, min(3, nearest_int(F(xb[16 * j + ii] / d))))
                L[16 * j + ii] = l + 4
        hm = [0] * 32
        for j in range(QK_K):
            if L[j] > 3:
                hm[j % 32] |= 1 << (j // 32)
                L[j] -= 4
        out += bytes(hm) + pack_pairs(L) + bytes(sc) + dbytes
    return out


IQ4 = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113]


def iq4_index(v):
    if v <= IQ4[0]:
        return 0
    if v >= IQ4[15]:
        return 15
    lo, hi = 0, 15
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if v < IQ4[mid]:
            hi = mid
        else:
            lo = mid
    return hi - 1 if F(v - F(IQ4[hi - 1])) < F(F(IQ4[hi]) - v) else hi


def iq4_fit(x):
    amax = F(0)
    mx = F(0)
    for v in x:
        if F(abs(v)) > amax:
            amax = F(abs(v))
            mx = v
    if amax < F(1e-15):
        return F(0)
    d = F(F(-mx) / F(IQ4[0]))
    idv = F(F(1) / d)
    sumqx = F(0)
    sumq2 = F(0)
    for v in x:
        q = F(IQ4[iq4_index(F(idv * v))])
        w = F(v * v)
        sumqx = F(sumqx + F(F(w * q) * v))
        sumq2 = F(sumq2 + F(F(w * q) * q))
    d = F(sumqx / sumq2)
    best = F(d * sumqx)
    for itry in range(-7, 8):
        idv = F(F(itry + IQ4[0]) / mx)
        sumqx = F(0)
        sumq2 = F(0)
        for v in x:
            q = F(IQ4[iq4_index(F(idv * v))])
            w = F(v * v)
            sumqx = F(sumqx + F(F(w * q) * v))
            sumq2 = F(sumq2 + F(F(w * q) * q))
        if sumq2 > 0 and F(sumqx * sumqx) > F(best * sumq2):
            d = F(sumqx / sumq2)
            best = F(d * sumqx)
    return d


def iq4_bytes(L):
    return bytes(L[j] | (L[j + 16] << 4) for j in range(16))


def iq4_nl(x):
    out = b""
    for i in range(0, len(x), 32):
        xb = x[i:i + 32]
        d = iq4_fit(xb)
        idv = F(F(1) / d) if d != 0 else F(0)
        out += f16_bytes(d) + iq4_bytes([iq4_index(F(idv * v)) for v in xb])
    return out


# mxfp4: ggml's kvalues_mxfp4 (E2M1 doubled) and quantize_row_mxfp4_ref.
# log2f is the C library's, as ggml calls it (numpy's float32 log2 may
# round differently just below a power of two).
MXFP4 = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12]
_libm = ctypes.CDLL(ctypes.util.find_library("m"))
_libm.log2f.restype = ctypes.c_float
_libm.log2f.argtypes = [ctypes.c_float]


def e8m0_half(e):
    # 2^(e - 128) exactly: the bits (e - 1) << 23, or the subnormals for e < 2
    u = (0x00200000 << e) if e < 2 else ((e - 1) << 23)
    return F(np.array([u], dtype=np.uint32).view(np.float32)[0])


def mxfp4(x):
    out = b""
    for i in range(0, len(x), 32):
        xb = x[i:i + 32]
        amax = F(0)
        for v in xb:
            if amax < F(abs(v)):
                amax = F(abs(v))
        e = 0
        if amax > 0:
            l = F(F(F(math.floor(_libm.log2f(float(amax)))) - F(2)) + F(127))
            e = 0 if l < 0 else 254 if l > 254 else int(l)  # toy's clamp (ggml: undefined outside)
        d = e8m0_half(e)
        L = []
        for v in xb:
            best, err = 0, F(abs(F(F(MXFP4[0]) * d) - v))
            for k in range(1, 16):
                ek = F(abs(F(F(MXFP4[k]) * d) - v))
                if ek < err:
                    best, err = k, ek
            L.append(best)
        out += bytes([e]) + iq4_bytes(L)
    return out


def iq4_xs(x):
    out = b""
    for i in range(0, len(x), QK_K):
        xb = x[i:i + QK_K]
        scales = [iq4_fit(xb[32 * ib:32 * ib + 32]) for ib in range(8)]
        max_scale = F(0)
        amax = F(0)
        for s_ in scales:
            if F(abs(s_)) > amax:
                amax = F(abs(s_))
                max_scale = s_
        d = F(F(-max_scale) / F(32))
        idv = F(F(1) / d) if d != 0 else F(0)
        sl = [0] * 4
        sh = 0
        qs = b""
        for ib in range(8):
            l = max(-32, min(31, nearest_int(F(idv * scales[ib]))))
            dl = F(d * F(l))
            idl = F(F(1) / dl) if dl != 0 else F(0)
            qs += iq4_bytes([iq4_index(F(idl * v)) for v in xb[32 * ib:32 * ib + 32]])
            u = l + 32
            sl[ib // 2] |= (u & 0xF) << (4 * (ib % 2))
            sh |= (u >> 4) << (2 * ib)
        out += f16_bytes(d) + struct.pack("<H", sh) + bytes(sl) + qs
    return out


def q6_k(x):
    out = b""
    for i in range(0, len(x), QK_K):
        xb = x[i:i + QK_K]
        L = [0] * QK_K
        scales = []
        max_scale = F(0)
        max_abs = F(0)
        for ib in range(16):
            s, Ls = make_qx(xb[16 * ib:16 * ib + 16], 32)
            L[16 * ib:16 * ib + 16] = Ls
            scales.append(s)
            if F(abs(s)) > max_abs:
                max_abs = F(abs(s))
                max_scale = s
        if max_abs < F(1e-15):
            out += bytes(210)
            continue
        iscale = F(F(-128) / max_scale)
        dbytes = f16_bytes(F(F(1) / iscale))
        sc = [min(127, nearest_int(F(iscale * s))) for s in scales]
        dd = f16_val(dbytes)
        for j in range(16):
            d = F(dd * F(sc[j]))
            if d == 0:
                continue
            for ii in range(16):
                l = max(-32, min(31, nearest_int(F(xb[16 * j + ii] / d))))
                L[16 * j + ii] = l + 32
        ql = [0] * 128
        qh = [0] * 64
        for j in range(0, QK_K, 128):
            o, h = j // 2, j // 4
            for l in range(32):
                q1, q2 = L[j + l] & 0xF, L[j + l + 32] & 0xF
                q3, q4 = L[j + l + 64] & 0xF, L[j + l + 96] & 0xF
                ql[o + l] = q1 | (q3 << 4)
                ql[o + l + 32] = q2 | (q4 << 4)
                qh[h + l] = (L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | \
                    ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6)
        out += bytes(ql) + bytes(qh) + bytes((v & 0xFF) for v in sc) + dbytes
    return out


# ---- dequantizers ------------------------------------------------------------------

def dq(t, b, n):
    y = []
    if t in (2, 3, 6, 7, 8):
        bs = {2: 18, 3: 20, 6: 22, 7: 24, 8: 34}[t]
        for k in range(0, len(b), bs):
            blk = b[k:k + bs]
            d = f16_val(blk[0:2])
            if t == 8:
                y += [F(F(v) * d) for v in np.frombuffer(blk[2:], dtype=np.int8)]
                continue
            m = f16_val(blk[2:4]) if t in (3, 7) else None
            off = 4 if t in (3, 7) else 2
            qh = 0
            if t in (6, 7):
                qh = struct.unpack("<I", blk[off:off + 4])[0]
                off += 4
            qs = blk[off:off + 16]
            lo = [0] * 16
            hi = [0] * 16
            for j in range(16):
                a, c = qs[j] & 0xF, qs[j] >> 4
                if t in (6, 7):
                    a |= ((qh >> j) << 4) & 0x10
                    c |= (qh >> (j + 12)) & 0x10
                if t == 2:
                    lo[j], hi[j] = F(F(a - 8) * d), F(F(c - 8) * d)
                elif t == 6:
                    lo[j], hi[j] = F(F(a - 16) * d), F(F(c - 16) * d)
                else:
                    lo[j], hi[j] = F(F(F(a) * d) + m), F(F(F(c) * d) + m)
            y += lo + hi
        return y
    if t == 12 or t == 13:
        bs = 144 if t == 12 else 176
        for k in range(0, len(b), bs):
            blk = b[k:k + bs]
            d = f16_val(blk[0:2])
            mn = f16_val(blk[2:4])
            sc = blk[4:16]
            qh = blk[16:48] if t == 13 else None
            q = blk[16:] if t == 12 else blk[48:]
            u1, u2 = 1, 2
            for j in range(4):
                s, m = scale_min_k4(2 * j, sc)
                d1, m1 = F(d * F(s)), F(mn * F(m))
                s, m = scale_min_k4(2 * j + 1, sc)
                d2, m2 = F(d * F(s)), F(mn * F(m))
                qq = q[32 * j:32 * j + 32]
                for l in range(32):
                    v = (qq[l] & 0xF) + (16 if qh is not None and qh[l] & u1 else 0)
                    y.append(F(F(d1 * F(v)) - m1))
                for l in range(32):
                    v = (qq[l] >> 4) + (16 if qh is not None and qh[l] & u2 else 0)
                    y.append(F(F(d2 * F(v)) - m2))
                u1 <<= 2
                u2 <<= 2
        return y
    if t == 14:
        for k in range(0, len(b), 210):
            blk = b[k:k + 210]
            ql, qh = blk[0:128], blk[128:192]
            sc = np.frombuffer(blk[192:208], dtype=np.int8)
            d = f16_val(blk[208:210])
            out = [F(0)] * 256
            for half in range(2):
                for l in range(32):
                    is_ = l // 16
                    a = ql[64 * half + l]
                    c = ql[64 * half + l + 32]
                    h = qh[32 * half + l]
                    q1 = ((a & 0xF) | (((h >> 0) & 3) << 4)) - 32
                    q2 = ((c & 0xF) | (((h >> 2) & 3) << 4)) - 32
                    q3 = ((a >> 4) | (((h >> 4) & 3) << 4)) - 32
                    q4 = ((c >> 4) | (((h >> 6) & 3) << 4)) - 32
                    base = 128 * half
                    s = sc[8 * half:]
                    out[base + l] = F(F(d * F(s[is_ + 0])) * F(q1))
                    out[base + l + 32] = F(F(d * F(s[is_ + 2])) * F(q2))
                    out[base + l + 64] = F(F(d * F(s[is_ + 4])) * F(q3))
                    out[base + l + 96] = F(F(d * F(s[is_ + 6])) * F(q4))
            y += out
        return y
    if t == 15:
        for k in range(0, len(b), 292):
            blk = b[k:k + 292]
            d = F(np.frombuffer(blk[0:4], dtype=np.float32)[0])
            y += [F(d * F(v)) for v in np.frombuffer(blk[4:260], dtype=np.int8)]
        return y
    if t in (20, 23):  # iq4_nl, iq4_xs: non-linear codebook
        cb = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113]
        bs = 18 if t == 20 else 136
        for k in range(0, len(b), bs):
            blk = b[k:k + bs]
            d = f16_val(blk[0:2])
            if t == 20:
                qs = blk[2:18]
                y += [F(d * F(cb[q & 0xF])) for q in qs] + [F(d * F(cb[q >> 4])) for q in qs]
                continue
            sh = struct.unpack("<H", blk[2:4])[0]
            sl = blk[4:8]
            for ib in range(8):
                ls = ((sl[ib // 2] >> (4 * (ib % 2))) & 0xF) | (((sh >> (2 * ib)) & 3) << 4)
                dl = F(d * F(ls - 32))
                qs = blk[8 + 16 * ib:8 + 16 * ib + 16]
                y += [F(dl * F(cb[q & 0xF])) for q in qs] + [F(dl * F(cb[q >> 4])) for q in qs]
        return y
    if t == 39:  # mxfp4
        for k in range(0, len(b), 17):
            d = e8m0_half(b[k])
            qs = b[k + 1:k + 17]
            with np.errstate(over="ignore"):  # e = 254, 255: the large values are inf, as in C
                y += [F(F(MXFP4[q & 0xF]) * d) for q in qs] + [F(F(MXFP4[q >> 4]) * d) for q in qs]
        return y
    if t == 11:
        for k in range(0, len(b), 110):
            blk = b[k:k + 110]
            hm, q, sc = blk[0:32], blk[32:96], blk[96:108]
            d = f16_val(blk[108:110])
            # 16 scales of 6 bits: low 4 bits from bytes 0..7 (nibbles), high 2 bits from bytes 8..11
            scales = []
            for j in range(16):
                lo = (sc[j] & 0xF) if j < 8 else (sc[j - 8] >> 4)
                hi = (sc[8 + j % 4] >> (2 * (j // 4))) & 3
                scales.append((lo | (hi << 4)) - 32)
            is_ = 0
            m = 1
            for n in range(2):
                qq = q[32 * n:32 * n + 32]
                for shift in (0, 2, 4, 6):
                    for half in range(2):
                        dl = F(d * F(scales[is_]))
                        is_ += 1
                        for l in range(16):
                            v = ((qq[l + 16 * half] >> shift) & 3) - (0 if hm[l + 16 * half] & m else 4)
                            y.append(F(dl * F(v)))
                    m <<= 1
        return y
    if t == 10:
        for k in range(0, len(b), 84):
            blk = b[k:k + 84]
            sc, q = blk[0:16], blk[16:80]
            d, mn = f16_val(blk[80:82]), f16_val(blk[82:84])
            is_ = 0
            for n in range(2):
                qq = q[32 * n:32 * n + 32]
                for shift in (0, 2, 4, 6):
                    for half in range(2):
                        s = sc[is_]
                        is_ += 1
                        dl, ml = F(d * F(s & 0xF)), F(mn * F(s >> 4))
                        for l in range(16):
                            y.append(F(F(dl * F((qq[l + 16 * half] >> shift) & 3)) - ml))
        return y
    raise ValueError(t)


def inputs(rng, n, kind):
    if kind == "normal":
        return rng.standard_normal(n).astype(np.float32)
    if kind == "wide":
        x = rng.standard_normal(n).astype(np.float32) * np.float32(1e-3)
        x[:: 37] *= np.float32(300)  # outliers
        return x.astype(np.float32)
    if kind == "special":
        x = rng.uniform(-1, 1, n).astype(np.float32)
        x[0:32] = 0                              # an all-zero block
        x[32:64] = np.float32(0.75)              # a constant block
        x[64:96] = -np.abs(x[64:96])             # all negative
        x[96:128] = np.abs(x[96:128]) + 1        # all positive, min > 0
        x[128:160] = np.float32(1e-20)           # tiny
        if n >= 512:
            x[256:512] = 0                       # an all-zero super-block
        return x.astype(np.float32)
    raise ValueError(kind)


def main():
    rng = np.random.default_rng(20260529)
    cases = []
    quants = [(8, q8_0), (2, lambda x: q4_0(x, 4)), (3, lambda x: q4_1(x, 4)),
              (6, lambda x: q4_0(x, 5)), (7, lambda x: q4_1(x, 5)),
              (12, q4_k), (13, q5_k), (14, q6_k), (10, q2_k), (11, q3_k), (20, iq4_nl), (23, iq4_xs)]
    for t, fn in quants:
        for kind in ("normal", "wide", "special"):
            n = 1024 if t in (2, 3, 6, 7, 8, 20) else 768
            x = inputs(rng, n, kind)
            xs = [F(v) for v in x]
            cases.append((0, t, n, x.tobytes(), fn(xs)))
    # dequantize: random blocks with finite, modest scales
    sizes = {2: 18, 3: 20, 6: 22, 7: 24, 8: 34, 10: 84, 11: 110, 12: 144, 13: 176, 14: 210, 15: 292,
             20: 18, 23: 136}
    bsz = {2: 32, 3: 32, 6: 32, 7: 32, 8: 32, 10: 256, 11: 256, 12: 256, 13: 256, 14: 256, 15: 256,
           20: 32, 23: 256}
    for t, sz in sizes.items():
        nb = 8
        raw = bytearray(rng.integers(0, 256, nb * sz, dtype=np.uint8).tobytes())
        for k in range(nb):
            blk = k * sz
            scl = lambda: f16_bytes(F(rng.uniform(-0.05, 0.05)))
            if t in (2, 3, 6, 7, 8, 12, 13, 20, 23):
                raw[blk:blk + 2] = scl()
            if t in (3, 7, 12, 13):
                raw[blk + 2:blk + 4] = scl()
            if t == 10:
                raw[blk + 80:blk + 82] = scl()
                raw[blk + 82:blk + 84] = scl()
            if t == 14:
                raw[blk + 208:blk + 210] = scl()
            if t == 11:
                raw[blk + 108:blk + 110] = scl()
            if t == 15:
                raw[blk:blk + 4] = np.float32(rng.uniform(-0.01, 0.01)).tobytes()
        raw = bytes(raw)
        y = np.array(dq(t, raw, nb * bsz[t]), dtype=np.float32)
        cases.append((1, t, nb * bsz[t], raw, y.tobytes()))
    # mxfp4, from an RNG of its own so that the cases above stay as they were
    rng = np.random.default_rng(20260530)
    for kind in ("normal", "wide", "special"):
        x = inputs(rng, 1024, kind)
        cases.append((0, 39, 1024, x.tobytes(), mxfp4([F(v) for v in x])))
    x = np.concatenate([rng.standard_normal(32).astype(np.float32) * np.float32(2.0) ** k
                        for k in (-140, -126, -100, -20, 0, 20, 100, 125)]).astype(np.float32)
    cases.append((0, 39, len(x), x.tobytes(), mxfp4([F(v) for v in x])))  # scales across the exponent range
    nb = 16  # every scale byte: random ones, and the edges 0, 1, 2, 127, 128, 253, 254, 255
    raw = bytearray(rng.integers(0, 256, nb * 17, dtype=np.uint8).tobytes())
    for k, e in enumerate((0, 1, 2, 127, 128, 253, 254, 255)):
        raw[17 * k] = e
    raw = bytes(raw)
    y = np.array(dq(39, raw, nb * 32), dtype=np.float32)
    cases.append((1, 39, nb * 32, raw, y.tobytes()))
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/data/quant-refs.bin"
    with open(out, "wb") as f:
        f.write(b"TQR1" + struct.pack("<I", len(cases)))
        for kind, t, n, a, b in cases:
            f.write(struct.pack("<III", kind, t, n))
            if kind == 0:
                f.write(a + struct.pack("<I", len(b)) + b)
            else:
                f.write(struct.pack("<I", len(a)) + a + b)
    print(f"{out}: {len(cases)} cases")


if __name__ == "__main__":
    main()
