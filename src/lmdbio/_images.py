"""Image decoding and the decoding threads, shared by lmdbio.datum (encoded
Datums) and lmdbio.convert (image files): OpenCV (``cv2``, what Caffe uses)
when importable, else Pillow, always to Caffe's channel order."""

import concurrent.futures
import os
import threading

import numpy as np

__all__ = ['image_backend', 'imdecode', 'chw', 'pool', 'default_threads']

_BACKEND = None


def image_backend():
    """The library that decodes encoded Datums: ``"cv2"`` (OpenCV, what
    Caffe uses) when importable, else ``"pil"`` (Pillow).
    ``$LMDBIO_IMAGE_BACKEND`` (cv2 or pil) forces one.  Raises ImportError
    when neither is installed."""
    global _BACKEND
    if _BACKEND is not None:
        return _BACKEND
    want = os.environ.get('LMDBIO_IMAGE_BACKEND', '').lower() or None
    if want not in (None, 'cv2', 'pil'):
        raise ValueError('LMDBIO_IMAGE_BACKEND must be cv2 or pil')
    errors = []
    for name in ((want,) if want else ('cv2', 'pil')):
        try:
            if name == 'cv2':
                import cv2  # noqa: F401
            else:
                import PIL.Image  # noqa: F401
            _BACKEND = name
            return name
        except ImportError as e:
            errors.append(str(e))
    raise ImportError('decoding encoded (JPEG/PNG) Datums needs OpenCV or '
                      'Pillow: pip install opencv-python-headless (or '
                      'Pillow)  [%s]' % '; '.join(errors))


def imdecode(buf, force_color, force_gray):
    """An image file's bytes -> np.uint8 (H, W, C) in BGR(A) order or
    (H, W) grey; raises on anything it cannot decode to 8 bits."""
    if image_backend() == 'cv2':
        import cv2
        flag = (cv2.IMREAD_COLOR if force_color else
                cv2.IMREAD_GRAYSCALE if force_gray else cv2.IMREAD_UNCHANGED)
        img = cv2.imdecode(buf, flag)
        if img is None:
            raise ValueError('not an image OpenCV can decode')
        if img.dtype != np.uint8:
            raise ValueError('a %s image: Caffe needs 8-bit pixels'
                             % img.dtype)
        return img
    import io
    from PIL import Image
    with Image.open(io.BytesIO(buf)) as im:
        im.load()
        if force_gray:
            im = im.convert('L')
        elif force_color:
            im = im.convert('RGB')
        elif im.mode == '1':
            im = im.convert('L')
        elif im.mode == 'P':
            im = im.convert('RGBA' if 'transparency' in im.info else 'RGB')
        elif im.mode == 'LA':
            im = im.convert('RGBA')
        elif im.mode in ('CMYK', 'YCbCr', 'LAB', 'HSV'):
            im = im.convert('RGB')
        elif im.mode not in ('L', 'RGB', 'RGBA'):
            raise ValueError('a %s image: Caffe needs 8-bit pixels' % im.mode)
        a = np.asarray(im)
    if a.ndim == 3:
        a = a[:, :, [2, 1, 0, 3][:a.shape[2]] if a.shape[2] == 4
              else slice(None, None, -1)]
    return a


def chw(img):
    return img[None] if img.ndim == 2 else img.transpose(2, 0, 1)


_POOLS = {}
_POOLS_LOCK = threading.Lock()


def pool(threads):
    with _POOLS_LOCK:
        pool = _POOLS.get(threads)
        if pool is None:
            pool = concurrent.futures.ThreadPoolExecutor(
                threads, thread_name_prefix='lmdbio-imdecode')
            _POOLS[threads] = pool
        return pool


def default_threads():
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(8, n))
