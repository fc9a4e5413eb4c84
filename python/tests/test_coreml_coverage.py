"""Every op type the Core ML importer maps has a test that builds it and compares kiln's outputs
with a reference written in the test (numpy): a new mapping without such a test fails here, with
every uncovered op in one message.

Found by reading the tests' source (nothing is run), so the result does not depend on which tests
ran or in which order. A test counts when it is a `test_*` function of a test_coreml*.py module
that compares outputs (calls check, close or numpy's assert_allclose / assert_array_equal,
directly or through a helper of its module), and it covers the ops it builds:

- MIL ops (kiln.coreml.supported_ops()): calls `mb.<op>(...)` and `getattr(mb, name)(...)`,
  `name` resolved through the test's parametrize lists, a loop over literals or the arguments a
  test gives a helper of its module that builds the op.
- NeuralNetwork layers (kiln.coreml.supported_layers(), or in a build without it the layer table
  of src/io/coreml/neural_network*.cpp, parsed from those sources): calls
  `<builder>.add_<layer>(...)` and `getattr(<builder>, "add_..." ...)(...)`, each
  NeuralNetworkBuilder method mapped to the layer field it writes by reading coremltools' source
  (add_elementwise by its mode).
- An op the test makes only indirectly (coremltools' quantization utilities write
  constexpr_affine_dequantize) counts when the test asserts it in the model's `op_histogram`.
- INDIRECT lists the ops whose only test checks outputs otherwise (plain asserts of an error
  bound), with the test and the reason (none now); an entry must name a test that reads the op
  from `op_histogram`, so it cannot outlive the test.
A `getattr` whose name cannot be resolved this way fails here too, naming its line."""
import ast
import functools
import inspect
import pathlib
import re
import warnings

import kiln

HERE = pathlib.Path(__file__).resolve().parent
NN_SOURCES = [HERE.parents[1] / "src" / "io" / "coreml" / f
              for f in ("neural_network.cpp", "neural_network_layers.cpp")]
COMPARE = {"check", "close", "assert_allclose", "assert_array_equal", "assert_array_almost_equal"}
# add_elementwise writes one of several layers, by its mode (coremltools' builder)
ELEMENTWISE = {"ADD": "add", "MULTIPLY": "multiply", "AVE": "average", "MAX": "max", "MIN": "min",
               "CONCAT": "concat", "SEQUENCE_CONCAT": "concat", "DOT": "dot", "COS": "dot"}
# op type -> (module, test, why it counts though it calls none of COMPARE)
INDIRECT = {}


class Unresolved(Exception):
    pass


def _called(f):
    """The name a call calls: f(...) or x.f(...)."""
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def _is_mb(e):
    return isinstance(e, ast.Name) and e.id == "mb"


class Module:
    """A test module's syntax tree and the values its names can take."""

    def __init__(self, path):
        self.path = path
        self.tree = ast.parse(path.read_text())
        self.consts = {n.targets[0].id: n.value for n in self.tree.body
                       if isinstance(n, ast.Assign) and len(n.targets) == 1
                       and isinstance(n.targets[0], ast.Name)}
        self.funcs = {n.name: n for n in self.tree.body if isinstance(n, ast.FunctionDef)}

    def where(self, node):
        return f"{self.path.name}:{node.lineno}"

    def strings(self, e, env):
        """The strings expression `e` can take: a literal, a name bound in `env` or a module
        constant, and `+` or f-strings of those."""
        if isinstance(e, ast.Constant) and isinstance(e.value, str):
            return {e.value}
        if isinstance(e, ast.Name):
            if env.get(e.id) is not None:
                return env[e.id]
            if e.id not in env and e.id in self.consts:
                return self.strings(self.consts[e.id], {})
        if isinstance(e, ast.BinOp) and isinstance(e.op, ast.Add):
            return {a + b for a in self.strings(e.left, env) for b in self.strings(e.right, env)}
        if isinstance(e, ast.JoinedStr):
            out = {""}
            for part in e.values:
                v = part.value if isinstance(part, ast.FormattedValue) else part
                out = {a + b for a in out for b in self.strings(v, env)}
            return out
        raise Unresolved

    def elements(self, e):
        """The element nodes of a collection: a literal, a dict's keys, a module constant, or
        sorted(), list(), tuple() or set() of one."""
        if isinstance(e, (ast.List, ast.Tuple, ast.Set)):
            return list(e.elts)
        if isinstance(e, ast.Dict):
            return list(e.keys)
        if isinstance(e, ast.Name) and e.id in self.consts:
            return self.elements(self.consts[e.id])
        if (isinstance(e, ast.Call) and _called(e.func) in ("sorted", "list", "tuple", "set")
                and len(e.args) == 1):
            return self.elements(e.args[0])
        raise Unresolved

    def bind(self, names, values, env):
        """Binds each name to the union of its column of `values` (rows of one or more nodes);
        a name whose values cannot be resolved is bound to None."""
        for i, n in enumerate(names):
            try:
                out = set()
                for row in values:
                    if isinstance(row, ast.Call) and _called(row.func) == "param":
                        row = ast.Tuple(elts=row.args) if len(names) > 1 else row.args[0]
                    if len(names) > 1:
                        if not isinstance(row, ast.Tuple):
                            raise Unresolved
                        row = row.elts[i]
                    out |= self.strings(row, env)
                env[n] = out
            except Unresolved:
                env[n] = None

    def parametrized(self, fn):
        """The test's names bound by @pytest.mark.parametrize."""
        env = {}
        for d in fn.decorator_list:
            if not (isinstance(d, ast.Call) and _called(d.func) == "parametrize"
                    and len(d.args) >= 2 and isinstance(d.args[0], ast.Constant)):
                continue
            names = [n.strip() for n in d.args[0].value.split(",")]
            try:
                rows = self.elements(d.args[1])
            except Unresolved:
                env.update({n: None for n in names})
                continue
            self.bind(names, rows, env)
        return env

    def with_locals(self, fn, env):
        """`env` and the names `fn` binds in a loop over a literal or to a string literal."""
        env = dict(env)
        for node in ast.walk(fn):
            if isinstance(node, ast.For) and isinstance(node.target, ast.Name):
                try:
                    self.bind([node.target.id], self.elements(node.iter), env)
                except Unresolved:
                    env[node.target.id] = None
            elif (isinstance(node, ast.Assign) and len(node.targets) == 1
                  and isinstance(node.targets[0], ast.Name)
                  and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
                name = node.targets[0].id
                env[name] = (env.get(name) or set()) | {node.value.value}
        return env

    def helper_env(self, helper, call, env):
        """A helper's parameters bound to the strings a call gives them."""
        params = [a.arg for a in helper.args.args]
        out = {}
        pairs = list(zip(params, call.args)) + [(k.arg, k.value) for k in call.keywords if k.arg]
        for name, value in pairs:
            try:
                out[name] = self.strings(value, env)
            except Unresolved:
                out[name] = None
        return out

    def compares(self, fn, depth=0):
        """Whether `fn` (or a helper of this module it calls) compares outputs."""
        for node in ast.walk(fn):
            if isinstance(node, ast.Call):
                name = _called(node.func)
                if name in COMPARE:
                    return True
                if (depth < 3 and isinstance(node.func, ast.Name) and name in self.funcs
                        and name != fn.name and self.compares(self.funcs[name], depth + 1)):
                    return True
        return False

    def builds(self, fn, env, errors, via=""):
        """(kind, op type or builder method, call, env) for each op `fn` builds, in nested
        functions and in the helpers of this module it calls; kind is "mil" or "nn". Names it
        cannot resolve go to `errors` as (kind, message); `via`: the call sites that led here."""
        env = self.with_locals(fn, env)
        out = []
        for node in ast.walk(fn):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            if isinstance(f, ast.Attribute) and _is_mb(f.value):
                out.append(("mil", f.attr, node, env))
            elif isinstance(f, ast.Attribute) and f.attr.startswith("add_"):
                out.append(("nn", f.attr, node, env))
            elif isinstance(f, ast.Call) and _called(f.func) == "getattr" and len(f.args) == 2:
                target, attr = f.args
                kind = "mil" if _is_mb(target) else "nn"
                if kind == "nn" and "add_" not in ast.unparse(attr):
                    continue
                try:
                    out += [(kind, s, node, env) for s in self.strings(attr, env)]
                except Unresolved:
                    errors.append((kind, f"{self.where(node)}{via}: which op does getattr("
                                         f"{ast.unparse(target)}, {ast.unparse(attr)}) build?"))
            elif (isinstance(f, ast.Name) and f.id in self.funcs and f.id != fn.name
                  and via.count("called") < 3):
                helper = self.funcs[f.id]
                out += self.builds(helper, self.helper_env(helper, node, env), errors,
                                   f" (called at {self.where(node)}{via})")
        return out

    def histogram_asserts(self, fn):
        """Op types the test reads from an op_histogram: m.op_histogram["op"] or .get("op")."""
        out = set()
        for node in ast.walk(fn):
            key = None
            if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute)
                    and node.value.attr == "op_histogram"):
                key = node.slice
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr == "get" and isinstance(node.func.value, ast.Attribute)
                  and node.func.value.attr == "op_histogram" and node.args):
                key = node.args[0]
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                out.add(key.value)
        return out


@functools.lru_cache(maxsize=None)
def builder_layers():
    """NeuralNetworkBuilder method -> the layer fields (types) its source writes."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from coremltools.models.neural_network import NeuralNetworkBuilder
        from coremltools.proto import NeuralNetwork_pb2

    oneof = NeuralNetwork_pb2.NeuralNetworkLayer.DESCRIPTOR.oneofs_by_name["layer"]
    fields = {f.name for f in oneof.fields}
    out = {}
    for name, method in vars(NeuralNetworkBuilder).items():
        if name.startswith("add_") and callable(method):
            out[name] = set(re.findall(r"spec_layer\.(\w+)", inspect.getsource(method))) & fields
    return out


@functools.lru_cache(maxsize=None)
def scan():
    """(MIL op types, NeuralNetwork layer types) the comparing tests cover, and the
    (kind, message) of each build the scan cannot read."""
    mil, nn, errors = set(), set(), []
    layers = builder_layers()
    for path in sorted(HERE.glob("test_coreml*.py")):
        if path.name == pathlib.Path(__file__).name:
            continue
        mod = Module(path)
        for fn in mod.funcs.values():
            if not fn.name.startswith("test_") or not mod.compares(fn):
                continue
            built = mod.builds(fn, mod.parametrized(fn), errors)
            # an op read from op_histogram counts for the kind of model the test builds
            kinds = {kind for kind, *_ in built} or {"mil"}
            found = mod.histogram_asserts(fn)
            mil |= found if "mil" in kinds else set()
            nn |= found if "nn" in kinds else set()
            for kind, name, call, env in built:
                if kind == "mil":
                    mil.add(name)
                    continue
                if name not in layers:
                    continue  # not a builder method
                if name != "add_elementwise":
                    if len(layers[name]) != 1:
                        errors.append(("nn", f"{mod.where(call)}: which layer does {name} "
                                             f"write? (its source names "
                                             f"{sorted(layers[name]) or 'none'})"))
                    nn |= layers[name]
                    continue
                mode = call.args[3] if len(call.args) > 3 else next(
                    (k.value for k in call.keywords if k.arg == "mode"), None)
                try:
                    nn |= {ELEMENTWISE[m] for m in mod.strings(mode, env)}
                except (Unresolved, KeyError):
                    errors.append(("nn", f"{mod.where(call)}: which mode does add_elementwise "
                                         "take?"))
    for op, (module, test, _) in INDIRECT.items():
        mod = Module(HERE / module)
        if test in mod.funcs and op in mod.histogram_asserts(mod.funcs[test]):
            mil.add(op)
        else:
            errors.append(("mil", f"INDIRECT[{op!r}]: {module}::{test} does not read {op} "
                                  "from its model's op_histogram"))
    return mil, nn, sorted(set(errors))


def mapped_layers():
    """The NeuralNetwork layer types the importer maps, by their names in op_histogram: from
    kiln.coreml.supported_layers() where the build has it, else parsed from the importer's
    layer table (`t[L::kX] = ...`, `unary(t, L::kX, ...)`, ...), each named through
    layer_type_name's table ({L::kX, "name"})."""
    if hasattr(kiln.coreml, "supported_layers"):
        return set(kiln.coreml.supported_layers())
    text = "\n".join(p.read_text() for p in NN_SOURCES)
    names = dict(re.findall(r'\{L::k(\w+), "(\w+)"\}', text))
    cases = set(re.findall(r"(?:\bt\[|\(t, )L::k(\w+)", text))
    assert len(names) > 100 and len(cases) > 50, "the layer table's form changed: update this"
    unnamed = sorted(cases - names.keys())
    assert not unnamed, f"mapped layers without a name in layer_type_name: {unnamed}"
    return {names[c] for c in cases}


def report(kind, what, mapped, covered, errors):
    """One message naming every mapped op without a test and every build the scan cannot read."""
    missing = sorted(set(mapped) - covered)
    unread = [m for k, m in errors if k == kind]
    msg = []
    if missing:
        msg.append(f"{len(missing)} {what} the importer maps have no test that builds them and "
                   f"checks the outputs: {', '.join(missing)}")
    if unread:
        msg.append("builds the coverage scan cannot read:\n  " + "\n  ".join(unread))
    return "\n".join(msg)


def test_every_mapped_mil_op_has_a_reference_test():
    mil, _, errors = scan()
    msg = report("mil", "MIL op types", kiln.coreml.supported_ops(), mil, errors)
    assert not msg, msg


def test_every_mapped_neural_network_layer_has_a_reference_test():
    _, nn, errors = scan()
    mapped = mapped_layers()
    assert {"convolution", "innerProduct", "reduceLogSum"} <= mapped
    msg = report("nn", "NeuralNetwork layer types", mapped, nn, errors)
    assert not msg, msg
