"""The per-token channel rules of `tito audit` (issue 46): expert routes (`routes`), top-p kept sets (`kept_sets`),
weight versions (`versions`), over what they share (`reading`). A cassette without channels costs them a few
attribute reads per engine call and a key lookup per sample: every check past that waits for a channel to be seen.
"""
