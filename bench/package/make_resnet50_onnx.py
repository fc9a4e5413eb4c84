"""Writes a ResNet-50 (torchvision's v1.5 architecture) as an ONNX file with random weights, for
bench/package/bench_package.cpp. Needs numpy and onnx (.venv after scripts/setup.sh).

    .venv/bin/python bench/package/make_resnet50_onnx.py resnet50.onnx [--batch 1]
"""
import argparse

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def build(batch):
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    counter = [0]

    def name(prefix):
        counter[0] += 1
        return f"{prefix}_{counter[0]}"

    def init(prefix, array):
        n = name(prefix)
        inits.append(numpy_helper.from_array(array.astype(np.float32), n))
        return n

    def conv(x, cin, cout, k, stride, pad):
        std = np.sqrt(2.0 / (cout * k * k))  # kaiming normal, fan_out
        w = init("w", rng.normal(0, std, (cout, cin, k, k)))
        y = name("conv")
        nodes.append(helper.make_node("Conv", [x, w], [y], kernel_shape=[k, k],
                                      strides=[stride, stride], pads=[pad] * 4))
        return y

    def bn(x, c):
        scale = init("gamma", rng.uniform(0.5, 1.5, c))
        bias = init("beta", rng.normal(0, 0.1, c))
        mean = init("mean", rng.normal(0, 0.05, c))
        var = init("var", rng.uniform(0.5, 1.5, c))
        y = name("bn")
        nodes.append(helper.make_node("BatchNormalization", [x, scale, bias, mean, var], [y],
                                      epsilon=1e-5))
        return y

    def relu(x):
        y = name("relu")
        nodes.append(helper.make_node("Relu", [x], [y]))
        return y

    def bottleneck(x, cin, width, stride):
        cout = width * 4
        h = relu(bn(conv(x, cin, width, 1, 1, 0), width))
        h = relu(bn(conv(h, width, width, 3, stride, 1), width))
        h = bn(conv(h, width, cout, 1, 1, 0), cout)
        identity = x
        if stride != 1 or cin != cout:
            identity = bn(conv(x, cin, cout, 1, stride, 0), cout)
        s = name("add")
        nodes.append(helper.make_node("Add", [h, identity], [s]))
        return relu(s)

    h = relu(bn(conv("input", 3, 64, 7, 2, 3), 64))
    p = name("pool")
    nodes.append(helper.make_node("MaxPool", [h], [p], kernel_shape=[3, 3], strides=[2, 2],
                                  pads=[1, 1, 1, 1]))
    h, cin = p, 64
    for layer, blocks in enumerate([3, 4, 6, 3]):
        width = 64 << layer
        for b in range(blocks):
            h = bottleneck(h, cin, width, 2 if layer > 0 and b == 0 else 1)
            cin = width * 4
    g = name("gap")
    nodes.append(helper.make_node("GlobalAveragePool", [h], [g]))
    f = name("flat")
    nodes.append(helper.make_node("Flatten", [g], [f], axis=1))
    bound = 1 / np.sqrt(2048)
    w = init("fc_w", rng.uniform(-bound, bound, (1000, 2048)))
    b = init("fc_b", rng.uniform(-bound, bound, 1000))
    nodes.append(helper.make_node("Gemm", [f, w, b], ["logits"], transB=1))

    graph = helper.make_graph(
        nodes, "resnet50",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, 3, 224, 224])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, 1000])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="bench/package/make_resnet50_onnx.py")
    onnx.checker.check_model(model)
    return model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--batch", type=int, default=1)
    args = ap.parse_args()
    model = build(args.batch)
    onnx.save(model, args.out)
    params = sum(int(np.prod(t.dims)) for t in model.graph.initializer)
    print(f"wrote {args.out}: {len(model.graph.node)} nodes, {params / 1e6:.1f}M parameters")


if __name__ == "__main__":
    main()
