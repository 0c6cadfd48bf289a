"""Google's own Python client (google-cloud-storage's async gRPC bidi classes, the engine under
gcsfs's Rapid support) against `rapidfs emulator`.

Usage: google_client_check.py HOST:PORT BUCKET [--faulty]

With --faulty the emulator injects faults (redirects, chaos): a downloader whose open was
redirected reopens with a read handle and so gets no object metadata, as the API says.

Creates an appendable object, appends across several flushes, closes it unfinalized, reads it
while unfinalized, takes it over by generation, appends more, finalizes with the whole-object
CRC32C, then reads it back as several ranges on one stream plus a second batch on the same
stream, comparing every byte. Exits non-zero with a message on the first mismatch.
"""

import asyncio
import os
import sys
from io import BytesIO

import google_crc32c
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud.storage.asyncio.async_appendable_object_writer import (
    AsyncAppendableObjectWriter,
)
from google.cloud.storage.asyncio.async_grpc_client import AsyncGrpcClient
from google.cloud.storage.asyncio.async_multi_range_downloader import (
    AsyncMultiRangeDownloader,
)

MIB = 1024 * 1024


def check(cond, what):
    if not cond:
        raise SystemExit(f"google_client_check: FAILED: {what}")


async def download(mrd, ranges):
    """Downloads [(offset, length)] on the open stream; returns the bytes of each."""
    bufs = [BytesIO() for _ in ranges]
    await mrd.download_ranges([(o, n, b) for (o, n), b in zip(ranges, bufs)])
    return [b.getvalue() for b in bufs]


async def main(endpoint, bucket, faulty):
    client = AsyncGrpcClient(
        credentials=AnonymousCredentials(),
        client_options=ClientOptions(api_endpoint=endpoint),
    )
    name = "google-client/appendable.bin"
    part1 = os.urandom(3 * MIB + 17)
    part2 = os.urandom(5 * MIB + 3)
    part3 = os.urandom(2 * MIB + 1001)

    # Create (create-only: generation 0), append across several flushes, close unfinalized.
    writer = AsyncAppendableObjectWriter(client, bucket, name, generation=0)
    await writer.open()
    generation = writer.generation
    check(generation, "the first response carries the new generation")
    await writer.append(part1)
    check(await writer.flush() == len(part1), "persisted size after the first flush")
    await writer.append(part2)
    persisted = await writer.flush()
    check(persisted == len(part1) + len(part2), f"persisted size after the second flush: {persisted}")
    closed = await writer.close()
    check(closed == len(part1) + len(part2), f"persisted size at close: {closed}")

    # Readable while unfinalized.
    mrd = await AsyncMultiRangeDownloader.create_mrd(client, bucket, name)
    (got,) = await download(mrd, [(0, 0)])
    check(got == part1 + part2, "reading the unfinalized object")
    await mrd.close()

    # Take over by generation (no handle), append more, finalize with the object's CRC32C.
    writer2 = AsyncAppendableObjectWriter(client, bucket, name, generation=generation)
    await writer2.open()
    check(writer2.persisted_size == len(part1) + len(part2), "size seen at takeover")
    await writer2.append(part3)
    whole = part1 + part2 + part3
    resource = await writer2.close(
        finalize_on_close=True, full_object_checksum=google_crc32c.value(whole)
    )
    check(resource.size == len(whole), f"finalized size {resource.size}")
    check(resource.generation == generation, "appends keep the generation")
    check(resource.finalize_time is not None, "finalize_time set")

    # Several ranges on one stream, then a second batch on the same stream.
    mrd = await AsyncMultiRangeDownloader.create_mrd(client, bucket, name)
    if not (faulty and mrd.persisted_size is None):
        check(mrd.persisted_size == len(whole), "object size seen by the downloader")
    first = [(0, 100), (MIB, 3 * MIB), (len(whole) - 1000, 1000), (7 * MIB + 5, 2 * MIB), (0, 0)]
    for (o, n), got in zip(first, await download(mrd, first)):
        want = whole[o:] if n == 0 else whole[o : o + n]
        check(got == want, f"range ({o}, {n}) of the first batch")
    second = [(12345, 4 * MIB), (len(whole) - 1, 1), (42, 0)]
    for (o, n), got in zip(second, await download(mrd, second)):
        want = whole[o:] if n == 0 else whole[o : o + n]
        check(got == want, f"range ({o}, {n}) of the second batch")
    await mrd.close()
    print(f"google_client_check: OK ({len(whole)} bytes, generation {generation})")


if __name__ == "__main__":
    args = sys.argv[1:]
    faulty = "--faulty" in args
    args = [a for a in args if a != "--faulty"]
    if len(args) != 2:
        raise SystemExit("usage: google_client_check.py HOST:PORT BUCKET [--faulty]")
    asyncio.run(main(args[0], args[1], faulty))
