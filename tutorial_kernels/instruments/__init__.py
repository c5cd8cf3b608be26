"""Instruments: what the GPU did, measured or counted — program timelines (`timeline`), the bytes a
schedule moves (`hbm_model`) and chapter 4's tile sweep (`tile_sweep`). They use the chapters'
kernels; no chapter imports them."""
