"""Where the rows of a result table ran, as moh recorded it (sampling.json's provenance and the checkpoint's
written_by, copied into each row by the reproduce scripts), so that no table silently mixes devices."""


def devices(rows):
    """the devices that trained and sampled these rows (rows written before moh recorded them: none)"""
    return sorted({r[k] for r in rows for k in ("trained_on", "sampled_on") if r.get(k)})


def mixed_devices_warning(rows):
    """a Markdown warning line when the rows ran on more than one device, else an empty string"""
    ran = devices(rows)
    if len(ran) < 2:
        return ""
    return (f"**Warning: these rows ran on {len(ran)} devices ({'; '.join(ran)}): the differences below mix devices, "
            "not only models.**\n")
