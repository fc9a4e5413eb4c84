"""kiln.Array: numpy round trips (exact for every dtype) and DLPack exchange without copies."""
import os

import ml_dtypes
import numpy as np
import pytest

import kiln
from conftest import cuda_available

DTYPES = {
    "float32": kiln.f32, "float16": kiln.f16, "float64": kiln.f64, "int8": kiln.i8,
    "uint8": kiln.u8, "int16": kiln.i16, "int32": kiln.i32, "int64": kiln.i64, "bool": kiln.bool_,
}


def random_array(rng, np_dtype, shape=(3, 5)):
    if np_dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    if np.dtype(np_dtype).kind in "iu":
        info = np.iinfo(np_dtype)
        return rng.integers(info.min, info.max, shape, dtype=np_dtype, endpoint=True)
    return (rng.standard_normal(shape) * 100).astype(np_dtype)


@pytest.mark.parametrize("np_dtype", list(DTYPES))
def test_numpy_round_trip_is_exact(rng, np_dtype):
    a = random_array(rng, np_dtype)
    k = kiln.Array(a)
    assert k.dtype == DTYPES[np_dtype] and k.shape == a.shape and k.ndim == 2 and k.size == a.size
    assert k.nbytes == a.nbytes and k.device == kiln.cpu and len(k) == 3
    b = k.numpy()
    assert b.dtype == a.dtype and b.shape == a.shape
    assert np.array_equal(a, b)
    assert np.array_equal(np.asarray(k), a) and k.tolist() == a.tolist()
    # numpy() copies: writing the copy leaves the array alone
    b.flat[0] = b.flat[1]
    assert np.array_equal(k.numpy(), a)


def test_bf16_round_trip_through_ml_dtypes(rng):
    a = rng.standard_normal((4, 7)).astype(ml_dtypes.bfloat16)
    k = kiln.Array(a)
    assert k.dtype == kiln.bf16 and kiln.bf16.numpy == np.dtype(ml_dtypes.bfloat16)
    b = k.numpy()
    assert b.dtype == ml_dtypes.bfloat16
    assert np.array_equal(a.view(np.uint16), b.view(np.uint16))
    # conversion on the way in rounds to nearest even, as ml_dtypes does
    f = rng.standard_normal(100).astype(np.float32)
    assert np.array_equal(kiln.Array(f, kiln.bf16).numpy().view(np.uint16),
                          f.astype(ml_dtypes.bfloat16).view(np.uint16))


def test_scalars_empty_and_conversions(rng, tmp_path):
    s = kiln.Array(np.float32(2.5))
    assert s.shape == () and s.item() == 2.5
    with pytest.raises(TypeError):
        len(s)
    e = kiln.Array(np.zeros((0, 3), np.int32))
    assert e.shape == (0, 3) and e.numpy().shape == (0, 3)
    a = rng.standard_normal((2, 6))
    k = kiln.asarray(a)
    assert kiln.asarray(k) is not None and k.dtype == kiln.f64
    np.testing.assert_array_equal(k.astype(kiln.f32).numpy(), a.astype(np.float32))
    np.testing.assert_array_equal(k.reshape([3, -1]).numpy(), a.reshape(3, 4))
    np.testing.assert_array_equal(k.copy().numpy(), a)
    np.testing.assert_array_equal(k.take_rows([1, 0]).numpy(), a[[1, 0]])
    assert "shape=(2, 6)" in repr(k)
    k.save_npy(str(tmp_path / "a.npy"))
    np.testing.assert_array_equal(np.load(tmp_path / "a.npy"), a)
    np.testing.assert_array_equal(kiln.Array.load_npy(str(tmp_path / "a.npy")).numpy(), a)
    assert kiln.Array.zeros([2, 2], kiln.i32).numpy().sum() == 0
    assert kiln.Array.empty([3], kiln.f16).shape == (3,)
    assert k.to("cpu").data_ptr == k.data_ptr  # already there: the same array
    with pytest.raises(kiln.DTypeError, match="complex128"):
        kiln.Array(np.ones(3, np.complex128))
    with pytest.raises(kiln.DTypeError, match="datetime64"):
        kiln.Array(np.zeros(3, "datetime64[D]"))


def test_dtypes_and_devices():
    assert kiln.dtype("f32") == kiln.f32 and kiln.dtype("float16") == kiln.f16
    assert kiln.dtype(np.int16) == kiln.i16 and kiln.dtype(kiln.bf16) == kiln.bf16
    assert kiln.dtype(ml_dtypes.bfloat16) == kiln.bf16
    with pytest.raises(kiln.DTypeError):
        kiln.dtype("f128")
    assert kiln.promote(kiln.f16, kiln.bf16) == kiln.f32 and kiln.promote(kiln.u8, kiln.i8) == kiln.i16
    assert kiln.f64.itemsize == 8 and kiln.bf16.is_floating and kiln.i32.is_integer
    assert kiln.bool_.numpy == np.dtype(bool)
    assert kiln.Device("cuda:1") == kiln.Device.cuda(1) and kiln.cuda(1) == kiln.Device.cuda(1)
    assert str(kiln.Device("cpu")) == "cpu" and repr(kiln.cpu) == "Device('cpu')"
    assert kiln.Device().kind == kiln.DeviceKind.cpu and kiln.Device.cuda(2).index == 2
    assert hash(kiln.Device("cpu")) == hash(kiln.cpu)
    with pytest.raises(kiln.ValueError):
        kiln.Device("tpu")
    assert kiln.cuda_device_count() >= 0
    assert kiln.default_device() in (kiln.cpu, kiln.cuda(0))


def test_dlpack_with_numpy_shares_memory(rng):
    a = rng.standard_normal((4, 3)).astype(np.float32)
    k = kiln.from_dlpack(a)
    assert k.data_ptr == a.ctypes.data and k.shape == (4, 3) and k.dtype == kiln.f32
    a[0, 0] = 42.0
    assert k.numpy()[0, 0] == 42.0
    del a  # the kiln array keeps numpy's memory alive
    assert k.numpy()[0, 0] == 42.0
    n = np.from_dlpack(k)
    assert n.ctypes.data == k.data_ptr and n.shape == (4, 3)
    assert k.__dlpack_device__() == (1, 0)
    for np_dtype in DTYPES:
        b = random_array(rng, np_dtype)
        kb = kiln.Array.from_dlpack(b)
        assert kb.dtype == DTYPES[np_dtype] and np.array_equal(np.from_dlpack(kb), b)
    with pytest.raises(kiln.ValueError, match="not C-contiguous"):
        kiln.from_dlpack(np.ones((3, 4))[:, ::2])




def _torch():
    return pytest.importorskip("torch")


def test_dlpack_with_pytorch_cpu(rng):
    torch = _torch()
    t = torch.randn(5, 6)
    k = kiln.from_dlpack(t)
    assert k.data_ptr == t.data_ptr() and k.device == kiln.cpu
    back = torch.from_dlpack(k)
    assert back.data_ptr() == t.data_ptr()
    for dt in (torch.bfloat16, torch.float16, torch.int64, torch.bool, torch.uint8):
        x = (torch.randn(3, 4) * 10).to(dt)
        kx = kiln.from_dlpack(x)
        assert torch.equal(torch.from_dlpack(kx), x)


def test_dlpack_with_pytorch_cuda_shares_the_pointer():
    torch = _torch()
    if not torch.cuda.is_available() or not cuda_available():
        pytest.skip("needs a CUDA device in PyTorch and kiln")
    t = torch.randn(64, 32, device="cuda")
    k = kiln.from_dlpack(t)
    assert k.device == kiln.cuda(0) and k.data_ptr == t.data_ptr()
    back = torch.from_dlpack(k)
    assert back.device.type == "cuda" and back.data_ptr() == t.data_ptr()
    np.testing.assert_array_equal(k.numpy(), t.cpu().numpy())
    # a kiln CUDA array goes to PyTorch without a copy too
    g = kiln.Array(np.arange(12, dtype=np.float32)).to("cuda")
    tg = torch.from_dlpack(g)
    assert tg.data_ptr() == g.data_ptr and tg.device.type == "cuda"
    assert tg.cpu().numpy().tolist() == list(range(12))


def test_dlpack_with_jax_and_cupy():
    ran = False
    # JAX takes 75% of a GPU's memory when its backend starts unless told not to
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    try:
        import jax.numpy as jnp

        x = jnp.arange(6.0, dtype=jnp.float32).reshape(2, 3)
        k = kiln.from_dlpack(x)
        np.testing.assert_array_equal(k.numpy(), np.asarray(x))
        np.testing.assert_array_equal(np.asarray(jnp.from_dlpack(k)), np.asarray(x))
        ran = True
    except ImportError:
        pass
    try:
        import cupy

        if cuda_available():
            c = cupy.arange(8, dtype=cupy.float32)
            k = kiln.from_dlpack(c)
            assert k.data_ptr == c.data.ptr
            assert cupy.from_dlpack(k).data.ptr == c.data.ptr
            ran = True
    except ImportError:
        pass
    if not ran:
        pytest.skip("neither JAX nor CuPy is installed")


@pytest.mark.skipif(not cuda_available(), reason="no CUDA device")
def test_cuda_arrays_round_trip(rng):
    a = rng.standard_normal((7, 9)).astype(np.float32)
    g = kiln.Array(a).to(kiln.cuda(0))
    assert g.device == kiln.cuda(0) and g.__dlpack_device__() == (2, 0)
    np.testing.assert_array_equal(g.numpy(), a)
    np.testing.assert_array_equal(g.to("cpu").numpy(), a)
