"""A walkthrough as an animated GIF, drawn with Pillow: one image per frame, the same parts lit
as on the page (agent, STM, LTM, audit), the caption and the events it rests on."""

from __future__ import annotations

import io
import textwrap

from PIL import Image, ImageDraw, ImageFont

from .walkthrough import FrameOut, WalkthroughOut

__all__ = ["SPEEDS", "render_gif"]

#: seconds a frame is shown (the page's speed menu)
SPEEDS = (3.5, 4.0, 4.5, 5.0, 5.5, 6.0)
_W, _H = 960, 540
_INK, _MUTED, _LINE, _BG = (24, 32, 48), (92, 102, 120), (206, 212, 222), (250, 251, 253)
_PARTS = (
    ("agent", "Agent", (71, 85, 105)),
    ("stm", "Short-term (STM)", (3, 105, 161)),
    ("ltm", "Long-term (LTM)", (21, 128, 61)),
    ("audit", "Audit tier", (146, 64, 14)),
)


def _font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    return ImageFont.load_default(size=size)


def _draw(frame: FrameOut, title: str) -> Image.Image:
    img = Image.new("RGB", (_W, _H), _BG)
    d = ImageDraw.Draw(img)
    d.text((32, 24), title, fill=_MUTED, font=_font(18))
    d.text((32, 52), f"Step {frame.step} of {frame.of}: {frame.title}", fill=_INK, font=_font(26))
    box_w, gap, top = 204, 16, 104
    for i, (key, label, colour) in enumerate(_PARTS):
        x = 32 + i * (box_w + gap)
        lit = key in frame.active
        d.rounded_rectangle(
            (x, top, x + box_w, top + 72),
            radius=10,
            fill=colour if lit else (255, 255, 255),
            outline=colour if lit else _LINE,
            width=3,
        )
        d.text((x + 16, top + 24), label, fill=(255, 255, 255) if lit else _MUTED, font=_font(19))
        if i:
            d.line((x - gap + 2, top + 36, x - 2, top + 36), fill=_LINE, width=3)
    y = 204
    for line in textwrap.wrap(frame.caption, 86)[:6]:
        d.text((32, y), line, fill=_INK, font=_font(18))
        y += 26
    y += 12
    for e in frame.events[:6]:
        ids = ", ".join(e.record_ids[:2]) + (f" +{len(e.record_ids) - 2}" if len(e.record_ids) > 2 else "")
        text = f"#{e.seq}  {e.action}  {e.source_tier} -> {e.target_tier}  {e.role}:{e.actor}  {ids}"
        d.text((32, y), text[:110], fill=_MUTED, font=_font(15))
        y += 22
    for i in range(frame.of):
        cx = _W // 2 - (frame.of - 1) * 14 + i * 28
        fill = _INK if i + 1 == frame.step else _LINE
        d.ellipse((cx - 6, _H - 34, cx + 6, _H - 22), fill=fill)
    return img


def render_gif(walkthrough: WalkthroughOut, seconds: float) -> bytes:
    """The frames of ``walkthrough`` as a looping GIF, each shown ``seconds``."""
    images = [_draw(f, walkthrough.title) for f in walkthrough.frames]
    out = io.BytesIO()
    images[0].save(
        out,
        "GIF",
        save_all=True,
        append_images=images[1:],
        duration=int(seconds * 1000),
        loop=0,
        optimize=False,
        disposal=1,
    )
    return out.getvalue()
