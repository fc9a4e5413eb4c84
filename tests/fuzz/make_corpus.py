#!/usr/bin/env python3
"""Writes the fuzz seed corpus: a few tiny valid ONNX models (elementwise, matmul + bias, conv,
a shape subgraph feeding Reshape, dim_params, an If, opset 24's Attention, RotaryEmbedding and
RMSNormalization, Col2Im, CumProd, Trilu, the unsigned, float8, packed 4- and 2-bit and float8e8m0
types, ai.onnx.preview's FlexAttention with score_mod and prob_mod subgraphs, and the ops kiln
writes out: Det, TfIdfVectorizer, DeformConv, RoiAlign; Scan-8's loops over a dynamic batch and
steps; NonZero of computed values and string ops, which a session splits the model at) and
truncated and bit-flipped variants of
each. Deterministic (fixed seed). The corpus also keeps found_*.onnx: inputs of 30-minute runs
that reached code the seeds do not (fuzz_onnx_import -merge=1; RNN, Trilu, Hardmax, Slice, Xor,
Selu, Mean and others), kept as they are. Usage: make_corpus.py OUT_DIR"""
import os
import random
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def model(nodes, inputs, outputs, inits=(), opset=17, ir=8, domains=()):
    g = helper.make_graph(nodes, "seed", inputs, outputs, list(inits))
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in domains]
    m = helper.make_model(g, opset_imports=opsets, producer_name="kiln-fuzz")
    m.ir_version = ir
    return m


def vi(name, shape, t=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, t, shape)


def seeds():
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal((3,)).astype(np.float32), "B")
    k = numpy_helper.from_array(rng.standard_normal((2, 1, 3, 3)).astype(np.float32), "K")
    yield "relu_add", model([helper.make_node("Relu", ["X"], ["R"]), helper.make_node("Add", ["R", "X"], ["Y"])],
                            [vi("X", [2, 3])], [vi("Y", [2, 3])])
    yield "gemm", model([helper.make_node("MatMul", ["X", "W"], ["M"]), helper.make_node("Add", ["M", "B"], ["Y"])],
                        [vi("X", ["batch", 4])], [vi("Y", ["batch", 3])], [w, b])
    yield "conv", model([helper.make_node("Conv", ["X", "K"], ["C"], pads=[1, 1, 1, 1]),
                         helper.make_node("MaxPool", ["C"], ["Y"], kernel_shape=[2, 2], strides=[2, 2])],
                        [vi("X", [1, 1, 4, 4])], [vi("Y", [1, 2, 2, 2])], [k])
    shape = numpy_helper.from_array(np.array([-1], dtype=np.int64), "S")
    yield "reshape", model([helper.make_node("Shape", ["X"], ["Sh"]),
                            helper.make_node("ReduceProd", ["Sh"], ["N"], keepdims=1),
                            helper.make_node("Reshape", ["X", "N"], ["F"]),
                            helper.make_node("Reshape", ["F", "S"], ["Y"]),],
                           [vi("X", [2, "n"])], [vi("Y", [None])], [shape])
    then_g = helper.make_graph([helper.make_node("Neg", ["X"], ["T"])], "then", [], [vi("T", [2])])
    else_g = helper.make_graph([helper.make_node("Abs", ["X"], ["E"])], "else", [], [vi("E", [2])])
    yield "if", model([helper.make_node("If", ["C"], ["Y"], then_branch=then_g, else_branch=else_g)],
                      [vi("C", [], TensorProto.BOOL), vi("X", [2])], [vi("Y", [2])])
    yield "softmax_cast", model([helper.make_node("Softmax", ["X"], ["S"], axis=-1),
                                 helper.make_node("Cast", ["S"], ["Y"], to=TensorProto.FLOAT16)],
                                [vi("X", [2, 5])], [vi("Y", [2, 5], TensorProto.FLOAT16)])
    # the newest opsets' transformer ops: RMSNormalization, RotaryEmbedding, and Attention over
    # past keys, causal, softcapped, with its qk_matmul_output (the written-out path)
    cos = numpy_helper.from_array(rng.standard_normal((8, 2)).astype(np.float32), "cos")
    sin = numpy_helper.from_array(rng.standard_normal((8, 2)).astype(np.float32), "sin")
    scale = numpy_helper.from_array(np.ones(16, np.float32), "g")
    yield "attention24", model(
        [helper.make_node("RMSNormalization", ["X", "g"], ["N"]),
         helper.make_node("RotaryEmbedding", ["N", "cos", "sin", "P"], ["R"], num_heads=4),
         helper.make_node("Attention", ["R", "R", "N", "", "PK", "PV"], ["Y", "K", "V", "QK"],
                          q_num_heads=4, kv_num_heads=4, is_causal=1, softcap=5.0,
                          qk_matmul_output_mode=3)],
        [vi("X", [1, 3, 16]), vi("P", [1, 3], TensorProto.INT64), vi("PK", [1, 4, 2, 4]),
         vi("PV", [1, 4, 2, 4])],
        [vi("Y", [1, 3, 16]), vi("K", [1, 4, 5, 4]), vi("V", [1, 4, 5, 4]),
         vi("QK", [1, 4, 3, 5])], [cos, sin, scale],
        opset=24, ir=10)
    # Col2Im, CumProd and Trilu with a run-time k (mappings of the newest node tests)
    dims = [numpy_helper.from_array(np.array(v, np.int64), n)
            for n, v in (("image", [4, 4]), ("block", [2, 2]), ("axis", 1))]
    yield "col2im_cumprod_trilu", model(
        [helper.make_node("Col2Im", ["X", "image", "block"], ["I"]),
         helper.make_node("CumProd", ["I", "axis"], ["C"], exclusive=1),
         helper.make_node("Trilu", ["C", "k"], ["Y"], upper=0)],
        [vi("X", [1, 8, 9]), vi("k", [], TensorProto.INT64)], [vi("Y", [1, 2, 4, 4])], dims,
        opset=26, ir=10)
    # the unsigned and 8-bit float element types: typed-field initializers (uint64_data, a uint16
    # zero point in int32_data), casts, and QuantizeLinear to uint16
    inits = [helper.make_tensor("U", TensorProto.UINT64, [3], [1, 2**63, 2**64 - 1]),
             helper.make_tensor("Z", TensorProto.UINT16, [], [7]),
             helper.make_tensor("S", TensorProto.FLOAT, [], [0.5])]
    yield "unsigned_float8", model(
        [helper.make_node("Cast", ["X"], ["C"], to=TensorProto.UINT64),
         helper.make_node("Add", ["C", "U"], ["Y"]),
         helper.make_node("QuantizeLinear", ["F", "S", "Z"], ["Q"]),
         helper.make_node("Cast", ["F"], ["E"], to=TensorProto.FLOAT8E4M3FN, saturate=0)],
        [vi("X", [3], TensorProto.UINT32), vi("F", [3])],
        [vi("Y", [3], TensorProto.UINT64), vi("Q", [3], TensorProto.UINT16),
         vi("E", [3], TensorProto.FLOAT8E4M3FN)], inits, opset=21, ir=10)
    # the packed 4- and 2-bit types and float8e8m0: an int4 initializer of an odd count in
    # int32_data, a uint2 one in raw_data, QuantizeLinear to int4 per axis and back, and casts to
    # float4e2m1 and (rounding to nearest) float8e8m0
    packed = [helper.make_tensor("W", TensorProto.INT4, [5], [-8, 7, 0, 3, -1]),
              helper.make_tensor("U2", TensorProto.UINT2, [3], np.array([0, 3, 1], np.uint8),
                                 raw=True),
              helper.make_tensor("Z4", TensorProto.INT4, [3], [1, 0, -2]),
              helper.make_tensor("S3", TensorProto.FLOAT, [3], [0.5, 1.0, 2.0])]
    yield "packed_narrow", model(
        [helper.make_node("Cast", ["W"], ["WF"], to=TensorProto.FLOAT),
         helper.make_node("QuantizeLinear", ["X", "S3", "Z4"], ["Q"], axis=0),
         helper.make_node("DequantizeLinear", ["Q", "S3", "Z4"], ["D"], axis=0),
         helper.make_node("Cast", ["U2"], ["UF"], to=TensorProto.FLOAT),
         helper.make_node("Cast", ["X"], ["F4"], to=TensorProto.FLOAT4E2M1),
         helper.make_node("Cast", ["X"], ["E8"], to=TensorProto.FLOAT8E8M0, round_mode="nearest")],
        [vi("X", [3, 2])],
        [vi("WF", [5]), vi("D", [3, 2]), vi("UF", [3]), vi("F4", [3, 2], TensorProto.FLOAT4E2M1),
         vi("E8", [3, 2], TensorProto.FLOAT8E8M0)], packed, opset=25, ir=12)

    # FlexAttention's modifier subgraphs (a soft cap, then squared probabilities)
    cap = helper.make_tensor("cap", TensorProto.FLOAT, [], [2.0])
    score_mod = helper.make_graph(
        [helper.make_node("Constant", [], ["c"], value=cap), helper.make_node("Div", ["s", "c"], ["d"]),
         helper.make_node("Tanh", ["d"], ["h"]), helper.make_node("Mul", ["h", "c"], ["t"])],
        "score_mod", [vi("s", None)], [vi("t", None)])
    prob_mod = helper.make_graph([helper.make_node("Mul", ["s", "s"], ["t"])], "prob_mod",
                                 [vi("s", None)], [vi("t", None)])
    yield "flex_attention", model(
        [helper.make_node("FlexAttention", ["Q", "K", "V"], ["Y"], domain="ai.onnx.preview",
                          score_mod=score_mod, prob_mod=prob_mod, scale=0.5)],
        [vi("Q", [1, 4, 3, 8]), vi("K", [1, 2, 5, 8]), vi("V", [1, 2, 5, 6])], [vi("Y", [1, 4, 3, 6])],
        opset=23, ir=10, domains=[("ai.onnx.preview", 1)])
    # the ops kiln writes out with several of its own
    rois = numpy_helper.from_array(np.array([[0, 0, 3, 3], [1, 0.5, 2.5, 4]], np.float32), "R")
    dk = numpy_helper.from_array(rng.standard_normal((2, 2, 2, 2)).astype(np.float32), "DK")
    yield "written_out", model(
        [helper.make_node("Det", ["M"], ["D"]),
         helper.make_node("TfIdfVectorizer", ["T"], ["F"], mode="TFIDF", min_gram_length=1,
                          max_gram_length=2, max_skip_count=1, ngram_counts=[0, 2],
                          ngram_indexes=[0, 1, 2], pool_int64s=[1, 2, 1, 2],
                          weights=[0.5, 1.0, 2.0]),
         helper.make_node("DeformConv", ["X", "DK", "O"], ["C"], kernel_shape=[2, 2]),
         helper.make_node("RoiAlign", ["X", "R", "B"], ["A"], sampling_ratio=0, output_height=2,
                          output_width=2, mode="max")],
        [vi("M", [2, 3, 3]), vi("T", [2, 5], TensorProto.INT64), vi("X", [1, 2, 4, 4]),
         vi("O", [1, 8, 3, 3]), vi("B", [2], TensorProto.INT64)],
        [vi("D", [2]), vi("F", [2, 3]), vi("C", [1, 2, 3, 3]), vi("A", [2, 2, 2, 2])],
        [rois, dk], opset=22, ir=10)
    # Scan-8 (a batch dim first; batch and steps dim_params): a loop over the batch around a
    # loop over the steps, one scan input read in reverse
    body = helper.make_graph([helper.make_node("Add", ["s", "a"], ["t"]),
                              helper.make_node("Mul", ["t", "b"], ["s2"]),
                              helper.make_node("Tanh", ["s2"], ["y"])], "body",
                             [vi("s", [2]), vi("a", [2]), vi("b", [2])], [vi("s2", [2]), vi("y", [2])])
    yield "scan8", model(
        [helper.make_node("Scan", ["", "S0", "XA", "XB"], ["S", "YS"], body=body,
                          num_scan_inputs=2, directions=[0, 1])],
        [vi("S0", ["N", 2]), vi("XA", ["N", "T", 2]), vi("XB", ["N", "T", 2])],
        [vi("S", ["N", 2]), vi("YS", ["N", "T", 2])], opset=8, ir=3)
    # a node sized by computed data (NonZero of x > 0) between two parts, as a session splits it
    yield "nonzero_split", model(
        [helper.make_node("Greater", ["X", "Z"], ["M"]), helper.make_node("NonZero", ["M"], ["N"]),
         helper.make_node("Transpose", ["N"], ["T"]), helper.make_node("GatherND", ["X", "T"], ["Y"])],
        [vi("X", ["n", 3])], [vi("Y", ["k"]), vi("N", [2, "k"], TensorProto.INT64)],
        [numpy_helper.from_array(np.array(0, np.float32), "Z")], opset=17)
    # strings, which a session runs on the host: split, match, encode, concatenate, compare
    S = TensorProto.STRING
    yield "strings", model(
        [helper.make_node("StringSplit", ["L"], ["P", "C"], delimiter=" "),
         helper.make_node("RegexFullMatch", ["P"], ["R"], pattern=r"[a-z]+\.com"),
         helper.make_node("LabelEncoder", ["C"], ["E"], domain="ai.onnx.ml", keys_int64s=[1, 2],
                          values_strings=["one", "two"], default_string="many"),
         helper.make_node("StringConcat", ["E", "E"], ["EE"]),
         helper.make_node("StringNormalizer", ["EE"], ["U"], case_change_action="UPPER",
                          stopwords=["ONEONE"]),
         helper.make_node("Equal", ["U", "W"], ["Q"])],
        [vi("L", ["n"], S)],
        [vi("R", ["n", "w"], TensorProto.BOOL), vi("U", ["u"], S), vi("Q", ["u"], TensorProto.BOOL)],
        [helper.make_tensor("W", S, [], [b"TWOTWO"])], opset=20, ir=9, domains=[("ai.onnx.ml", 3)])


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rnd = random.Random(1234)
    for name, m in seeds():
        onnx.checker.check_model(m)
        data = m.SerializeToString()
        variants = {name: data, name + "_trunc_half": data[: len(data) // 2], name + "_trunc_tail": data[:-3]}
        for i in range(3):
            b = bytearray(data)
            for _ in range(1 + i):
                pos = rnd.randrange(len(b))
                b[pos] ^= 1 << rnd.randrange(8)
            variants[f"{name}_flip{i}"] = bytes(b)
        for vname, vdata in variants.items():
            with open(os.path.join(out, vname + ".onnx"), "wb") as f:
                f.write(vdata)


if __name__ == "__main__":
    main()
