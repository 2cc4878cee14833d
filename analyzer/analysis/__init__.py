"""What the data means: row and level scores (``scores``, ``rows``), bottleneck classes
(``bottleneck``), the one GPU-hour partition (``partition``), episodes of a condition over time
(``episodes``), the XID catalogue (``xid``), and ``evaluate``, which judges the detectors on
labelled scenarios. ``analyzer.pipeline`` runs it all in one place.
"""
