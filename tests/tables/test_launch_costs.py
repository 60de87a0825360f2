"""Launch cost split into the launch call's own CPU time and the queue time (GPU start - call
end), checked on three launches of the H200 Kineto trace read by hand from its JSON.

Hand reading of tests/data/h200/llama2layer_eager_decode.trace.json.gz (ts and dur in us):

=====  ============================  ================  ====================  ===================
corr   cudaLaunchKernel ts, dur       call end          kernel ts             GPU start - end
=====  ============================  ================  ====================  ===================
8      4412313722175.382, 48.323     ...722223.705     ...722221.170         -2.535 us (started
                                                                             before the call returned)
19     4412313722340.704, 11.338     ...722352.042     ...722353.554         1.512 us
34     4412313722395.082, 10.729     ...722405.811     ...722407.506         1.695 us
=====  ============================  ================  ====================  ===================
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import H200_LLAMA

from tracestory.analysis.timeline import launch_costs, timeline
from tracestory.ingest.kineto import load_kineto


@pytest.fixture(scope="module")
def trace():
    return load_kineto(H200_LLAMA)


def test_three_launches_read_by_hand(trace):
    rows, api_ns, queue_ns = launch_costs(trace)
    n_k = len(trace.kernels)
    corr = np.where(rows < n_k, trace.kernels["correlation"][np.minimum(rows, n_k - 1)], -1)
    by_corr = {int(c): (int(a), int(q)) for c, a, q in zip(corr, api_ns, queue_ns, strict=True) if c >= 0}
    assert by_corr[8] == (48_323, -2_535)
    assert by_corr[19] == (11_338, 1_512)
    assert by_corr[34] == (10_729, 1_695)


def test_timeline_distributions_are_the_per_op_values(trace):
    _, api_ns, queue_ns = launch_costs(trace)
    tl = timeline(trace)
    assert tl.launch_api.count == tl.launch_queue.count == tl.launch_to_start.count == api_ns.size == 914
    assert tl.launch_api.p50_ns == pytest.approx(float(np.median(api_ns)))
    assert tl.launch_queue.p50_ns == pytest.approx(float(np.median(queue_ns)))
    assert tl.launch_to_start.p50_ns == pytest.approx(float(np.median(api_ns + queue_ns)))
