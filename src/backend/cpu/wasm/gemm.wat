;; WebAssembly SIMD (128-bit f32x4) matrix-product kernels of the CPU backend (loaded by ../wasm.ts,
;; assembled into gemm.wasm by scripts/build-wasm.mjs with the wabt package).
;;
;; All pointers are BYTE offsets into the one shared memory the backend allocates its float32 buffers from.
;; Offset 0 is never handed out by the allocator, so a bias pointer of 0 means "no bias".
;;
;; Determinism: every output element is computed by the same sequence of float32 operations whatever tile
;; shape (4x2, 1x1, 4x8, 4x4, 1x4 ...) it falls into, so the result does not depend on how a product is cut
;; into row/column ranges for threads. The shapes only decide how many elements share each load.
;;
;;   gemm_nt: out[i, j] (+)= bias[j] + sum_k A[i, k] * B[j, k]
;;     per element: a 4-lane accumulator over k in steps of 4 (lane l sums k = 4t + l in order), then
;;     s = (l0 + l1) + (l2 + l3), then the K % 4 tail in order, then + bias[j], then out + s (accumulate) or s.
;;   gemm_nn: out[i, c] (+)= sum_j A[i*sai + j*saj] * B[j*ldb + c]      (A read through strides, so the same
;;     kernel does dout * W (A row-major) and dout^T * inp (A transposed) without transposing anything)
;;     per element: s = 0; s += a*b for j = 0..J-1 in order; then out + s (accumulate) or s. (The caller,
;;     GemmKernels.nn in ../wasm.ts, runs J in fixed blocks of j, each accumulated in turn.)
;;     f32x4 lanes do exactly the float32 operations of the scalar path, so vector and scalar tiles agree.
;;
;;   attention rows (../kernels/attention.ts runs them per query row; hd = head dim, strides in elements):
;;   attn_dots: out[s] = scale * dot(x, y[s*ys .. s*ys + hd)) for s < n; per element: a 4-lane accumulator
;;     over d in steps of 4, then (l0 + l1) + (l2 + l3), then the hd % 4 tail in order, then * scale.
;;   attn_pv: out[d] (+)= sum_s p[s] * y[s*ys + d] for d < hd; per element: c = 0; c += p*y for s in order;
;;     then out + c (accumulate) or c.
;;   attn_outer: dst[s*ys + d] += a[s] * x[d] for s < n, d < hd (one rounding per update).
(module
  (import "env" "memory" (memory 1 65536 shared))

  ;; ------------------------------------------------------------------------------------------------
  ;; gemm_nt
  ;; ------------------------------------------------------------------------------------------------

  ;; The end of one gemm_nt element: horizontal sum of $v, the $n-element k tail at $pa/$pb, bias, store.
  (func $nt_finish (param $v v128) (param $pa i32) (param $pb i32) (param $n i32)
                   (param $bias i32) (param $po i32) (param $acc i32)
    (local $s f32)
    (local.set $s
      (f32.add
        (f32.add (f32x4.extract_lane 0 (local.get $v)) (f32x4.extract_lane 1 (local.get $v)))
        (f32.add (f32x4.extract_lane 2 (local.get $v)) (f32x4.extract_lane 3 (local.get $v)))))
    (block $done
      (loop $tail
        (br_if $done (i32.eqz (local.get $n)))
        (local.set $s (f32.add (local.get $s) (f32.mul (f32.load (local.get $pa)) (f32.load (local.get $pb)))))
        (local.set $pa (i32.add (local.get $pa) (i32.const 4)))
        (local.set $pb (i32.add (local.get $pb) (i32.const 4)))
        (local.set $n (i32.sub (local.get $n) (i32.const 1)))
        (br $tail)))
    (if (local.get $bias) (then (local.set $s (f32.add (local.get $s) (f32.load (local.get $bias))))))
    (if (local.get $acc) (then (local.set $s (f32.add (f32.load (local.get $po)) (local.get $s)))))
    (f32.store (local.get $po) (local.get $s)))

  ;; One element: $pa = &A[i, 0], $pb = &B[j, 0], $k4 = bytes of the k range done 4 at a time, $kt = K % 4.
  (func $nt_1x1 (param $pa i32) (param $pb i32) (param $k4 i32) (param $kt i32)
                (param $bias i32) (param $po i32) (param $acc i32)
    (local $kb i32) (local $c v128)
    (block $kx
      (loop $kl
        (br_if $kx (i32.ge_u (local.get $kb) (local.get $k4)))
        (local.set $c (f32x4.add (local.get $c)
          (f32x4.mul (v128.load (i32.add (local.get $pa) (local.get $kb)))
                     (v128.load (i32.add (local.get $pb) (local.get $kb))))))
        (local.set $kb (i32.add (local.get $kb) (i32.const 16)))
        (br $kl)))
    (call $nt_finish (local.get $c)
      (i32.add (local.get $pa) (local.get $k4)) (i32.add (local.get $pb) (local.get $k4)) (local.get $kt)
      (local.get $bias) (local.get $po) (local.get $acc)))

  ;; 4 rows of A (row stride $rs bytes from $pa) x 2 rows of B ($pb, $pb + $rs): 8 f32x4 accumulators.
  ;; $po = &out[i, j], $ob = out row stride in bytes, $bias = &bias[j] or 0.
  (func $nt_4x2 (param $pa i32) (param $pb i32) (param $rs i32) (param $k4 i32) (param $kt i32)
                (param $bias i32) (param $po i32) (param $ob i32) (param $acc i32)
    (local $kb i32) (local $pa1 i32) (local $pa2 i32) (local $pa3 i32) (local $pb1 i32) (local $bias1 i32)
    (local $x v128) (local $y0 v128) (local $y1 v128)
    (local $c00 v128) (local $c01 v128) (local $c10 v128) (local $c11 v128)
    (local $c20 v128) (local $c21 v128) (local $c30 v128) (local $c31 v128)
    (local.set $pa1 (i32.add (local.get $pa) (local.get $rs)))
    (local.set $pa2 (i32.add (local.get $pa1) (local.get $rs)))
    (local.set $pa3 (i32.add (local.get $pa2) (local.get $rs)))
    (local.set $pb1 (i32.add (local.get $pb) (local.get $rs)))
    (block $kx
      (loop $kl
        (br_if $kx (i32.ge_u (local.get $kb) (local.get $k4)))
        (local.set $y0 (v128.load (i32.add (local.get $pb) (local.get $kb))))
        (local.set $y1 (v128.load (i32.add (local.get $pb1) (local.get $kb))))
        (local.set $x (v128.load (i32.add (local.get $pa) (local.get $kb))))
        (local.set $c00 (f32x4.add (local.get $c00) (f32x4.mul (local.get $x) (local.get $y0))))
        (local.set $c01 (f32x4.add (local.get $c01) (f32x4.mul (local.get $x) (local.get $y1))))
        (local.set $x (v128.load (i32.add (local.get $pa1) (local.get $kb))))
        (local.set $c10 (f32x4.add (local.get $c10) (f32x4.mul (local.get $x) (local.get $y0))))
        (local.set $c11 (f32x4.add (local.get $c11) (f32x4.mul (local.get $x) (local.get $y1))))
        (local.set $x (v128.load (i32.add (local.get $pa2) (local.get $kb))))
        (local.set $c20 (f32x4.add (local.get $c20) (f32x4.mul (local.get $x) (local.get $y0))))
        (local.set $c21 (f32x4.add (local.get $c21) (f32x4.mul (local.get $x) (local.get $y1))))
        (local.set $x (v128.load (i32.add (local.get $pa3) (local.get $kb))))
        (local.set $c30 (f32x4.add (local.get $c30) (f32x4.mul (local.get $x) (local.get $y0))))
        (local.set $c31 (f32x4.add (local.get $c31) (f32x4.mul (local.get $x) (local.get $y1))))
        (local.set $kb (i32.add (local.get $kb) (i32.const 16)))
        (br $kl)))
    (local.set $bias1 (select (i32.add (local.get $bias) (i32.const 4)) (i32.const 0) (local.get $bias)))
    (local.set $pa (i32.add (local.get $pa) (local.get $k4)))
    (local.set $pa1 (i32.add (local.get $pa1) (local.get $k4)))
    (local.set $pa2 (i32.add (local.get $pa2) (local.get $k4)))
    (local.set $pa3 (i32.add (local.get $pa3) (local.get $k4)))
    (local.set $pb (i32.add (local.get $pb) (local.get $k4)))
    (local.set $pb1 (i32.add (local.get $pb1) (local.get $k4)))
    (call $nt_finish (local.get $c00) (local.get $pa) (local.get $pb) (local.get $kt) (local.get $bias) (local.get $po) (local.get $acc))
    (call $nt_finish (local.get $c01) (local.get $pa) (local.get $pb1) (local.get $kt) (local.get $bias1) (i32.add (local.get $po) (i32.const 4)) (local.get $acc))
    (local.set $po (i32.add (local.get $po) (local.get $ob)))
    (call $nt_finish (local.get $c10) (local.get $pa1) (local.get $pb) (local.get $kt) (local.get $bias) (local.get $po) (local.get $acc))
    (call $nt_finish (local.get $c11) (local.get $pa1) (local.get $pb1) (local.get $kt) (local.get $bias1) (i32.add (local.get $po) (i32.const 4)) (local.get $acc))
    (local.set $po (i32.add (local.get $po) (local.get $ob)))
    (call $nt_finish (local.get $c20) (local.get $pa2) (local.get $pb) (local.get $kt) (local.get $bias) (local.get $po) (local.get $acc))
    (call $nt_finish (local.get $c21) (local.get $pa2) (local.get $pb1) (local.get $kt) (local.get $bias1) (i32.add (local.get $po) (i32.const 4)) (local.get $acc))
    (local.set $po (i32.add (local.get $po) (local.get $ob)))
    (call $nt_finish (local.get $c30) (local.get $pa3) (local.get $pb) (local.get $kt) (local.get $bias) (local.get $po) (local.get $acc))
    (call $nt_finish (local.get $c31) (local.get $pa3) (local.get $pb1) (local.get $kt) (local.get $bias1) (i32.add (local.get $po) (i32.const 4)) (local.get $acc)))

  ;; out[i*ldo + j] (+)= bias[j] + sum_{k<K} A[i*K + k] * B[j*K + k] for i in [i0, i1), j in [j0, j1).
  (func (export "gemm_nt")
        (param $out i32) (param $a i32) (param $b i32) (param $bias i32) (param $K i32) (param $ldo i32)
        (param $i0 i32) (param $i1 i32) (param $j0 i32) (param $j1 i32) (param $acc i32)
    (local $rs i32) (local $k4 i32) (local $kt i32) (local $ob i32)
    (local $i i32) (local $j i32) (local $r i32) (local $pa i32) (local $po i32)
    (local.set $rs (i32.shl (local.get $K) (i32.const 2)))
    (local.set $k4 (i32.and (local.get $rs) (i32.const -16)))
    (local.set $kt (i32.and (local.get $K) (i32.const 3)))
    (local.set $ob (i32.shl (local.get $ldo) (i32.const 2)))
    (local.set $i (local.get $i0))
    ;; rows 4 at a time: 4x2 tiles, then the odd last column element by element
    (block $rx
      (loop $rl
        (br_if $rx (i32.gt_s (i32.add (local.get $i) (i32.const 4)) (local.get $i1)))
        (local.set $pa (i32.add (local.get $a) (i32.mul (local.get $i) (local.get $rs))))
        (local.set $j (local.get $j0))
        (block $cx
          (loop $cl
            (br_if $cx (i32.gt_s (i32.add (local.get $j) (i32.const 2)) (local.get $j1)))
            (call $nt_4x2 (local.get $pa) (i32.add (local.get $b) (i32.mul (local.get $j) (local.get $rs)))
              (local.get $rs) (local.get $k4) (local.get $kt)
              (select (i32.add (local.get $bias) (i32.shl (local.get $j) (i32.const 2))) (i32.const 0) (local.get $bias))
              (i32.add (local.get $out) (i32.shl (i32.add (i32.mul (local.get $i) (local.get $ldo)) (local.get $j)) (i32.const 2)))
              (local.get $ob) (local.get $acc))
            (local.set $j (i32.add (local.get $j) (i32.const 2)))
            (br $cl)))
        (if (i32.lt_s (local.get $j) (local.get $j1))
          (then
            (local.set $r (i32.const 0))
            (loop $tl
              (call $nt_1x1
                (i32.add (local.get $pa) (i32.mul (local.get $r) (local.get $rs)))
                (i32.add (local.get $b) (i32.mul (local.get $j) (local.get $rs)))
                (local.get $k4) (local.get $kt)
                (select (i32.add (local.get $bias) (i32.shl (local.get $j) (i32.const 2))) (i32.const 0) (local.get $bias))
                (i32.add (local.get $out)
                  (i32.shl (i32.add (i32.mul (i32.add (local.get $i) (local.get $r)) (local.get $ldo)) (local.get $j)) (i32.const 2)))
                (local.get $acc))
              (local.set $r (i32.add (local.get $r) (i32.const 1)))
              (br_if $tl (i32.lt_s (local.get $r) (i32.const 4))))))
        (local.set $i (i32.add (local.get $i) (i32.const 4)))
        (br $rl)))
    ;; the last i1 - i < 4 rows, element by element
    (block $ex
      (loop $el
        (br_if $ex (i32.ge_s (local.get $i) (local.get $i1)))
        (local.set $pa (i32.add (local.get $a) (i32.mul (local.get $i) (local.get $rs))))
        (local.set $j (local.get $j0))
        (block $fx
          (loop $fl
            (br_if $fx (i32.ge_s (local.get $j) (local.get $j1)))
            (call $nt_1x1 (local.get $pa) (i32.add (local.get $b) (i32.mul (local.get $j) (local.get $rs)))
              (local.get $k4) (local.get $kt)
              (select (i32.add (local.get $bias) (i32.shl (local.get $j) (i32.const 2))) (i32.const 0) (local.get $bias))
              (i32.add (local.get $out) (i32.shl (i32.add (i32.mul (local.get $i) (local.get $ldo)) (local.get $j)) (i32.const 2)))
              (local.get $acc))
            (local.set $j (i32.add (local.get $j) (i32.const 1)))
            (br $fl)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $el))))

  ;; ------------------------------------------------------------------------------------------------
  ;; gemm_nn (A through strides)
  ;; ------------------------------------------------------------------------------------------------

  ;; Stores a finished f32x4 of sums at $po: out = out + v (accumulate) or v.
  (func $nn_store (param $po i32) (param $v v128) (param $acc i32)
    (if (local.get $acc)
      (then (v128.store (local.get $po) (f32x4.add (v128.load (local.get $po)) (local.get $v))))
      (else (v128.store (local.get $po) (local.get $v)))))

  ;; One element. $pa = &A(i, 0), $sj = A's j stride in bytes, $pb = &B[0, c], $lb = B row stride in bytes.
  (func $nn_1x1 (param $po i32) (param $pa i32) (param $sj i32) (param $pb i32) (param $lb i32) (param $J i32) (param $acc i32)
    (local $s f32)
    (block $x
      (loop $l
        (br_if $x (i32.eqz (local.get $J)))
        (local.set $s (f32.add (local.get $s) (f32.mul (f32.load (local.get $pa)) (f32.load (local.get $pb)))))
        (local.set $pa (i32.add (local.get $pa) (local.get $sj)))
        (local.set $pb (i32.add (local.get $pb) (local.get $lb)))
        (local.set $J (i32.sub (local.get $J) (i32.const 1)))
        (br $l)))
    (if (local.get $acc) (then (local.set $s (f32.add (f32.load (local.get $po)) (local.get $s)))))
    (f32.store (local.get $po) (local.get $s)))

  ;; 1 row x 4 columns.
  (func $nn_1x4 (param $po i32) (param $pa i32) (param $sj i32) (param $pb i32) (param $lb i32) (param $J i32) (param $acc i32)
    (local $c v128)
    (block $x
      (loop $l
        (br_if $x (i32.eqz (local.get $J)))
        (local.set $c (f32x4.add (local.get $c) (f32x4.mul (f32x4.splat (f32.load (local.get $pa))) (v128.load (local.get $pb)))))
        (local.set $pa (i32.add (local.get $pa) (local.get $sj)))
        (local.set $pb (i32.add (local.get $pb) (local.get $lb)))
        (local.set $J (i32.sub (local.get $J) (i32.const 1)))
        (br $l)))
    (call $nn_store (local.get $po) (local.get $c) (local.get $acc)))

  ;; 4 rows ($pa, A's i stride $si bytes) x 4 columns; $ob = out row stride in bytes.
  (func $nn_4x4 (param $po i32) (param $ob i32) (param $pa i32) (param $si i32) (param $sj i32)
                (param $pb i32) (param $lb i32) (param $J i32) (param $acc i32)
    (local $pa1 i32) (local $pa2 i32) (local $pa3 i32) (local $y v128)
    (local $c0 v128) (local $c1 v128) (local $c2 v128) (local $c3 v128)
    (local.set $pa1 (i32.add (local.get $pa) (local.get $si)))
    (local.set $pa2 (i32.add (local.get $pa1) (local.get $si)))
    (local.set $pa3 (i32.add (local.get $pa2) (local.get $si)))
    (block $x
      (loop $l
        (br_if $x (i32.eqz (local.get $J)))
        (local.set $y (v128.load (local.get $pb)))
        (local.set $c0 (f32x4.add (local.get $c0) (f32x4.mul (f32x4.splat (f32.load (local.get $pa))) (local.get $y))))
        (local.set $c1 (f32x4.add (local.get $c1) (f32x4.mul (f32x4.splat (f32.load (local.get $pa1))) (local.get $y))))
        (local.set $c2 (f32x4.add (local.get $c2) (f32x4.mul (f32x4.splat (f32.load (local.get $pa2))) (local.get $y))))
        (local.set $c3 (f32x4.add (local.get $c3) (f32x4.mul (f32x4.splat (f32.load (local.get $pa3))) (local.get $y))))
        (local.set $pa (i32.add (local.get $pa) (local.get $sj)))
        (local.set $pa1 (i32.add (local.get $pa1) (local.get $sj)))
        (local.set $pa2 (i32.add (local.get $pa2) (local.get $sj)))
        (local.set $pa3 (i32.add (local.get $pa3) (local.get $sj)))
        (local.set $pb (i32.add (local.get $pb) (local.get $lb)))
        (local.set $J (i32.sub (local.get $J) (i32.const 1)))
        (br $l)))
    (call $nn_store (local.get $po) (local.get $c0) (local.get $acc))
    (local.set $po (i32.add (local.get $po) (local.get $ob)))
    (call $nn_store (local.get $po) (local.get $c1) (local.get $acc))
    (local.set $po (i32.add (local.get $po) (local.get $ob)))
    (call $nn_store (local.get $po) (local.get $c2) (local.get $acc))
    (local.set $po (i32.add (local.get $po) (local.get $ob)))
    (call $nn_store (local.get $po) (local.get $c3) (local.get $acc)))

  ;; 4 rows x 8 columns: 8 f32x4 accumulators.
  (func $nn_4x8 (param $po i32) (param $ob i32) (param $pa i32) (param $si i32) (param $sj i32)
                (param $pb i32) (param $lb i32) (param $J i32) (param $acc i32)
    (local $pa1 i32) (local $pa2 i32) (local $pa3 i32) (local $x v128) (local $y0 v128) (local $y1 v128)
    (local $c00 v128) (local $c01 v128) (local $c10 v128) (local $c11 v128)
    (local $c20 v128) (local $c21 v128) (local $c30 v128) (local $c31 v128)
    (local.set $pa1 (i32.add (local.get $pa) (local.get $si)))
    (local.set $pa2 (i32.add (local.get $pa1) (local.get $si)))
    (local.set $pa3 (i32.add (local.get $pa2) (local.get $si)))
    (block $x
      (loop $l
        (br_if $x (i32.eqz (local.get $J)))
        (local.set $y0 (v128.load (local.get $pb)))
        (local.set $y1 (v128.load offset=16 (local.get $pb)))
        (local.set $x (f32x4.splat (f32.load (local.get $pa))))
        (local.set $c00 (f32x4.add (local.get $c00) (f32x4.mul (local.get $x) (local.get $y0))))
        (local.set $c01 (f32x4.add (local.get $c01) (f32x4.mul (local.get $x) (local.get $y1))))
        (local.set $x (f32x4.splat (f32.load (local.get $pa1))))
        (local.set $c10 (f32x4.add (local.get $c10) (f32x4.mul (local.get $x) (local.get $y0))))
        (local.set $c11 (f32x4.add (local.get $c11) (f32x4.mul (local.get $x) (local.get $y1))))
        (local.set $x (f32x4.splat (f32.load (local.get $pa2))))
        (local.set $c20 (f32x4.add (local.get $c20) (f32x4.mul (local.get $x) (local.get $y0))))
        (local.set $c21 (f32x4.add (local.get $c21) (f32x4.mul (local.get $x) (local.get $y1))))
        (local.set $x (f32x4.splat (f32.load (local.get $pa3))))
        (local.set $c30 (f32x4.add (local.get $c30) (f32x4.mul (local.get $x) (local.get $y0))))
        (local.set $c31 (f32x4.add (local.get $c31) (f32x4.mul (local.get $x) (local.get $y1))))
        (local.set $pa (i32.add (local.get $pa) (local.get $sj)))
        (local.set $pa1 (i32.add (local.get $pa1) (local.get $sj)))
        (local.set $pa2 (i32.add (local.get $pa2) (local.get $sj)))
        (local.set $pa3 (i32.add (local.get $pa3) (local.get $sj)))
        (local.set $pb (i32.add (local.get $pb) (local.get $lb)))
        (local.set $J (i32.sub (local.get $J) (i32.const 1)))
        (br $l)))
    (call $nn_store (local.get $po) (local.get $c00) (local.get $acc))
    (call $nn_store (i32.add (local.get $po) (i32.const 16)) (local.get $c01) (local.get $acc))
    (local.set $po (i32.add (local.get $po) (local.get $ob)))
    (call $nn_store (local.get $po) (local.get $c10) (local.get $acc))
    (call $nn_store (i32.add (local.get $po) (i32.const 16)) (local.get $c11) (local.get $acc))
    (local.set $po (i32.add (local.get $po) (local.get $ob)))
    (call $nn_store (local.get $po) (local.get $c20) (local.get $acc))
    (call $nn_store (i32.add (local.get $po) (i32.const 16)) (local.get $c21) (local.get $acc))
    (local.set $po (i32.add (local.get $po) (local.get $ob)))
    (call $nn_store (local.get $po) (local.get $c30) (local.get $acc))
    (call $nn_store (i32.add (local.get $po) (i32.const 16)) (local.get $c31) (local.get $acc)))

  ;; out[i*ldo + c] (+)= sum_{j<J} A[i*sai + j*saj] * B[j*ldb + c] for i in [i0, i1), c in [c0, c1)
  ;; (strides in elements).
  (func (export "gemm_nn")
        (param $out i32) (param $a i32) (param $b i32) (param $J i32) (param $sai i32) (param $saj i32)
        (param $ldb i32) (param $ldo i32) (param $i0 i32) (param $i1 i32) (param $c0 i32) (param $c1 i32) (param $acc i32)
    (local $si i32) (local $sj i32) (local $lb i32) (local $ob i32)
    (local $i i32) (local $c i32) (local $r i32) (local $pa i32) (local $po i32)
    (local.set $si (i32.shl (local.get $sai) (i32.const 2)))
    (local.set $sj (i32.shl (local.get $saj) (i32.const 2)))
    (local.set $lb (i32.shl (local.get $ldb) (i32.const 2)))
    (local.set $ob (i32.shl (local.get $ldo) (i32.const 2)))
    (local.set $i (local.get $i0))
    (block $rx
      (loop $rl
        (br_if $rx (i32.gt_s (i32.add (local.get $i) (i32.const 4)) (local.get $i1)))
        (local.set $pa (i32.add (local.get $a) (i32.mul (local.get $i) (local.get $si))))
        (local.set $po (i32.add (local.get $out) (i32.mul (local.get $i) (local.get $ob))))
        (local.set $c (local.get $c0))
        (block $cx
          (loop $cl
            (br_if $cx (i32.gt_s (i32.add (local.get $c) (i32.const 8)) (local.get $c1)))
            (call $nn_4x8 (i32.add (local.get $po) (i32.shl (local.get $c) (i32.const 2))) (local.get $ob)
              (local.get $pa) (local.get $si) (local.get $sj)
              (i32.add (local.get $b) (i32.shl (local.get $c) (i32.const 2))) (local.get $lb) (local.get $J) (local.get $acc))
            (local.set $c (i32.add (local.get $c) (i32.const 8)))
            (br $cl)))
        (if (i32.le_s (i32.add (local.get $c) (i32.const 4)) (local.get $c1))
          (then
            (call $nn_4x4 (i32.add (local.get $po) (i32.shl (local.get $c) (i32.const 2))) (local.get $ob)
              (local.get $pa) (local.get $si) (local.get $sj)
              (i32.add (local.get $b) (i32.shl (local.get $c) (i32.const 2))) (local.get $lb) (local.get $J) (local.get $acc))
            (local.set $c (i32.add (local.get $c) (i32.const 4)))))
        (block $tx
          (loop $tl
            (br_if $tx (i32.ge_s (local.get $c) (local.get $c1)))
            (local.set $r (i32.const 0))
            (loop $ul
              (call $nn_1x1
                (i32.add (local.get $po) (i32.add (i32.mul (local.get $r) (local.get $ob)) (i32.shl (local.get $c) (i32.const 2))))
                (i32.add (local.get $pa) (i32.mul (local.get $r) (local.get $si))) (local.get $sj)
                (i32.add (local.get $b) (i32.shl (local.get $c) (i32.const 2))) (local.get $lb) (local.get $J) (local.get $acc))
              (local.set $r (i32.add (local.get $r) (i32.const 1)))
              (br_if $ul (i32.lt_s (local.get $r) (i32.const 4))))
            (local.set $c (i32.add (local.get $c) (i32.const 1)))
            (br $tl)))
        (local.set $i (i32.add (local.get $i) (i32.const 4)))
        (br $rl)))
    ;; the last i1 - i < 4 rows: 1x4 tiles, then element by element
    (block $ex
      (loop $el
        (br_if $ex (i32.ge_s (local.get $i) (local.get $i1)))
        (local.set $pa (i32.add (local.get $a) (i32.mul (local.get $i) (local.get $si))))
        (local.set $po (i32.add (local.get $out) (i32.mul (local.get $i) (local.get $ob))))
        (local.set $c (local.get $c0))
        (block $fx
          (loop $fl
            (br_if $fx (i32.gt_s (i32.add (local.get $c) (i32.const 4)) (local.get $c1)))
            (call $nn_1x4 (i32.add (local.get $po) (i32.shl (local.get $c) (i32.const 2)))
              (local.get $pa) (local.get $sj)
              (i32.add (local.get $b) (i32.shl (local.get $c) (i32.const 2))) (local.get $lb) (local.get $J) (local.get $acc))
            (local.set $c (i32.add (local.get $c) (i32.const 4)))
            (br $fl)))
        (block $gx
          (loop $gl
            (br_if $gx (i32.ge_s (local.get $c) (local.get $c1)))
            (call $nn_1x1 (i32.add (local.get $po) (i32.shl (local.get $c) (i32.const 2)))
              (local.get $pa) (local.get $sj)
              (i32.add (local.get $b) (i32.shl (local.get $c) (i32.const 2))) (local.get $lb) (local.get $J) (local.get $acc))
            (local.set $c (i32.add (local.get $c) (i32.const 1)))
            (br $gl)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $el))))

  ;; ------------------------------------------------------------------------------------------------
  ;; attention rows
  ;; ------------------------------------------------------------------------------------------------

  ;; Horizontal sum of $v, then the $n-element tail at $px/$py, then * $scale.
  (func $dot_finish (param $v v128) (param $px i32) (param $py i32) (param $n i32) (param $scale f32) (result f32)
    (local $s f32)
    (local.set $s
      (f32.add
        (f32.add (f32x4.extract_lane 0 (local.get $v)) (f32x4.extract_lane 1 (local.get $v)))
        (f32.add (f32x4.extract_lane 2 (local.get $v)) (f32x4.extract_lane 3 (local.get $v)))))
    (block $done
      (loop $tail
        (br_if $done (i32.eqz (local.get $n)))
        (local.set $s (f32.add (local.get $s) (f32.mul (f32.load (local.get $px)) (f32.load (local.get $py)))))
        (local.set $px (i32.add (local.get $px) (i32.const 4)))
        (local.set $py (i32.add (local.get $py) (i32.const 4)))
        (local.set $n (i32.sub (local.get $n) (i32.const 1)))
        (br $tail)))
    (f32.mul (local.get $s) (local.get $scale)))

  ;; out[s] = scale * sum_d x[d] * y[s*ys + d] for s < n (two rows of y at a time).
  (func (export "attn_dots") (param $out i32) (param $x i32) (param $y i32) (param $ys i32) (param $n i32)
                             (param $hd i32) (param $scale f32)
    (local $yb i32) (local $h4 i32) (local $ht i32) (local $db i32) (local $py1 i32) (local $xv v128)
    (local $c0 v128) (local $c1 v128)
    (local.set $yb (i32.shl (local.get $ys) (i32.const 2)))
    (local.set $h4 (i32.and (i32.shl (local.get $hd) (i32.const 2)) (i32.const -16)))
    (local.set $ht (i32.and (local.get $hd) (i32.const 3)))
    (block $px
      (loop $pl
        (br_if $px (i32.lt_s (local.get $n) (i32.const 2)))
        (local.set $py1 (i32.add (local.get $y) (local.get $yb)))
        (local.set $c0 (v128.const i32x4 0 0 0 0))
        (local.set $c1 (v128.const i32x4 0 0 0 0))
        (local.set $db (i32.const 0))
        (block $dx
          (loop $dl
            (br_if $dx (i32.ge_u (local.get $db) (local.get $h4)))
            (local.set $xv (v128.load (i32.add (local.get $x) (local.get $db))))
            (local.set $c0 (f32x4.add (local.get $c0) (f32x4.mul (local.get $xv) (v128.load (i32.add (local.get $y) (local.get $db))))))
            (local.set $c1 (f32x4.add (local.get $c1) (f32x4.mul (local.get $xv) (v128.load (i32.add (local.get $py1) (local.get $db))))))
            (local.set $db (i32.add (local.get $db) (i32.const 16)))
            (br $dl)))
        (f32.store (local.get $out) (call $dot_finish (local.get $c0) (i32.add (local.get $x) (local.get $h4))
          (i32.add (local.get $y) (local.get $h4)) (local.get $ht) (local.get $scale)))
        (f32.store offset=4 (local.get $out) (call $dot_finish (local.get $c1) (i32.add (local.get $x) (local.get $h4))
          (i32.add (local.get $py1) (local.get $h4)) (local.get $ht) (local.get $scale)))
        (local.set $out (i32.add (local.get $out) (i32.const 8)))
        (local.set $y (i32.add (local.get $py1) (local.get $yb)))
        (local.set $n (i32.sub (local.get $n) (i32.const 2)))
        (br $pl)))
    (if (i32.gt_s (local.get $n) (i32.const 0))
      (then
        (local.set $c0 (v128.const i32x4 0 0 0 0))
        (local.set $db (i32.const 0))
        (block $ex
          (loop $el
            (br_if $ex (i32.ge_u (local.get $db) (local.get $h4)))
            (local.set $c0 (f32x4.add (local.get $c0) (f32x4.mul (v128.load (i32.add (local.get $x) (local.get $db)))
              (v128.load (i32.add (local.get $y) (local.get $db))))))
            (local.set $db (i32.add (local.get $db) (i32.const 16)))
            (br $el)))
        (f32.store (local.get $out) (call $dot_finish (local.get $c0) (i32.add (local.get $x) (local.get $h4))
          (i32.add (local.get $y) (local.get $h4)) (local.get $ht) (local.get $scale))))))

  ;; out[d] (+)= sum_{s<n} p[s] * y[s*ys + d] for d < hd: columns 8, then 4, then 1 at a time.
  (func (export "attn_pv") (param $out i32) (param $p i32) (param $y i32) (param $ys i32) (param $n i32)
                           (param $hd i32) (param $acc i32)
    (local $yb i32) (local $d i32) (local $s i32) (local $pp i32) (local $py i32) (local $w v128)
    (local $c0 v128) (local $c1 v128) (local $c f32)
    (local.set $yb (i32.shl (local.get $ys) (i32.const 2)))
    (block $x8
      (loop $l8
        (br_if $x8 (i32.gt_s (i32.add (local.get $d) (i32.const 8)) (local.get $hd)))
        (local.set $c0 (v128.const i32x4 0 0 0 0))
        (local.set $c1 (v128.const i32x4 0 0 0 0))
        (local.set $pp (local.get $p))
        (local.set $py (i32.add (local.get $y) (i32.shl (local.get $d) (i32.const 2))))
        (local.set $s (local.get $n))
        (block $sx
          (loop $sl
            (br_if $sx (i32.eqz (local.get $s)))
            (local.set $w (f32x4.splat (f32.load (local.get $pp))))
            (local.set $c0 (f32x4.add (local.get $c0) (f32x4.mul (local.get $w) (v128.load (local.get $py)))))
            (local.set $c1 (f32x4.add (local.get $c1) (f32x4.mul (local.get $w) (v128.load offset=16 (local.get $py)))))
            (local.set $pp (i32.add (local.get $pp) (i32.const 4)))
            (local.set $py (i32.add (local.get $py) (local.get $yb)))
            (local.set $s (i32.sub (local.get $s) (i32.const 1)))
            (br $sl)))
        (local.set $pp (i32.add (local.get $out) (i32.shl (local.get $d) (i32.const 2))))
        (call $nn_store (local.get $pp) (local.get $c0) (local.get $acc))
        (call $nn_store (i32.add (local.get $pp) (i32.const 16)) (local.get $c1) (local.get $acc))
        (local.set $d (i32.add (local.get $d) (i32.const 8)))
        (br $l8)))
    (if (i32.le_s (i32.add (local.get $d) (i32.const 4)) (local.get $hd))
      (then
        (local.set $c0 (v128.const i32x4 0 0 0 0))
        (local.set $pp (local.get $p))
        (local.set $py (i32.add (local.get $y) (i32.shl (local.get $d) (i32.const 2))))
        (local.set $s (local.get $n))
        (block $tx
          (loop $tl
            (br_if $tx (i32.eqz (local.get $s)))
            (local.set $c0 (f32x4.add (local.get $c0) (f32x4.mul (f32x4.splat (f32.load (local.get $pp))) (v128.load (local.get $py)))))
            (local.set $pp (i32.add (local.get $pp) (i32.const 4)))
            (local.set $py (i32.add (local.get $py) (local.get $yb)))
            (local.set $s (i32.sub (local.get $s) (i32.const 1)))
            (br $tl)))
        (call $nn_store (i32.add (local.get $out) (i32.shl (local.get $d) (i32.const 2))) (local.get $c0) (local.get $acc))
        (local.set $d (i32.add (local.get $d) (i32.const 4)))))
    (block $x1
      (loop $l1
        (br_if $x1 (i32.ge_s (local.get $d) (local.get $hd)))
        (local.set $c (f32.const 0))
        (local.set $pp (local.get $p))
        (local.set $py (i32.add (local.get $y) (i32.shl (local.get $d) (i32.const 2))))
        (local.set $s (local.get $n))
        (block $ux
          (loop $ul
            (br_if $ux (i32.eqz (local.get $s)))
            (local.set $c (f32.add (local.get $c) (f32.mul (f32.load (local.get $pp)) (f32.load (local.get $py)))))
            (local.set $pp (i32.add (local.get $pp) (i32.const 4)))
            (local.set $py (i32.add (local.get $py) (local.get $yb)))
            (local.set $s (i32.sub (local.get $s) (i32.const 1)))
            (br $ul)))
        (local.set $pp (i32.add (local.get $out) (i32.shl (local.get $d) (i32.const 2))))
        (if (local.get $acc) (then (local.set $c (f32.add (f32.load (local.get $pp)) (local.get $c)))))
        (f32.store (local.get $pp) (local.get $c))
        (local.set $d (i32.add (local.get $d) (i32.const 1)))
        (br $l1))))

  ;; dst[s*ys + d] += a[s] * x[d] for s < n, d < hd.
  (func (export "attn_outer") (param $dst i32) (param $a i32) (param $x i32) (param $ys i32) (param $n i32) (param $hd i32)
    (local $yb i32) (local $h4 i32) (local $db i32) (local $w v128) (local $ws f32) (local $pd i32)
    (local.set $yb (i32.shl (local.get $ys) (i32.const 2)))
    (local.set $h4 (i32.and (i32.shl (local.get $hd) (i32.const 2)) (i32.const -16)))
    (block $sx
      (loop $sl
        (br_if $sx (i32.eqz (local.get $n)))
        (local.set $ws (f32.load (local.get $a)))
        (local.set $w (f32x4.splat (local.get $ws)))
        (local.set $db (i32.const 0))
        (block $dx
          (loop $dl
            (br_if $dx (i32.ge_u (local.get $db) (local.get $h4)))
            (local.set $pd (i32.add (local.get $dst) (local.get $db)))
            (v128.store (local.get $pd) (f32x4.add (v128.load (local.get $pd))
              (f32x4.mul (local.get $w) (v128.load (i32.add (local.get $x) (local.get $db))))))
            (local.set $db (i32.add (local.get $db) (i32.const 16)))
            (br $dl)))
        (block $tx
          (loop $tl
            (br_if $tx (i32.ge_u (local.get $db) (i32.shl (local.get $hd) (i32.const 2))))
            (local.set $pd (i32.add (local.get $dst) (local.get $db)))
            (f32.store (local.get $pd) (f32.add (f32.load (local.get $pd))
              (f32.mul (local.get $ws) (f32.load (i32.add (local.get $x) (local.get $db))))))
            (local.set $db (i32.add (local.get $db) (i32.const 4)))
            (br $tl)))
        (local.set $a (i32.add (local.get $a) (i32.const 4)))
        (local.set $dst (i32.add (local.get $dst) (local.get $yb)))
        (local.set $n (i32.sub (local.get $n) (i32.const 1)))
        (br $sl))))
)
