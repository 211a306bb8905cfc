// Why: reading and writing 16-bit PCM WAV files, for clips sent to `transcribe`/`voice` and
// replies saved from `speak`/`voice` (the examples and tests use it).
package org.kazeia.client;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.file.Files;
import java.nio.file.Path;

public final class Wav {
    private Wav() {}

    public static Pcm read(Path file) {
        try {
            return parse(Files.readAllBytes(file));
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    /** A RIFF/WAVE of 16-bit PCM (format 1, or extensible); anything else: code bad_request. */
    public static Pcm parse(byte[] wav) {
        ByteBuffer b = ByteBuffer.wrap(wav).order(ByteOrder.LITTLE_ENDIAN);
        if (wav.length < 12 || b.getInt(0) != 0x46464952 /* RIFF */ || b.getInt(8) != 0x45564157 /* WAVE */) {
            throw bad("not a RIFF/WAVE file");
        }
        int pos = 12;
        int rate = 0;
        int channels = 0;
        while (pos + 8 <= wav.length) {
            int tag = b.getInt(pos);
            long size = Integer.toUnsignedLong(b.getInt(pos + 4));
            int body = pos + 8;
            if (tag == 0x20746d66 /* "fmt " */) {
                if (size < 16 || body + 16 > wav.length) {
                    throw bad("short fmt chunk");
                }
                int format = Short.toUnsignedInt(b.getShort(body));
                channels = Short.toUnsignedInt(b.getShort(body + 2));
                rate = b.getInt(body + 4);
                int bits = Short.toUnsignedInt(b.getShort(body + 14));
                if ((format != 1 && format != 0xfffe) || bits != 16) {
                    throw bad("only 16-bit PCM is read (format " + format + ", " + bits + " bits)");
                }
            } else if (tag == 0x61746164 /* "data" */) {
                if (rate <= 0 || channels < 1) {
                    throw bad("data chunk before fmt");
                }
                // Streamed WAVs (espeak-ng to a pipe) leave the size at its maximum: take what is there.
                long n = Math.min(size, wav.length - body);
                n -= n % (2L * channels);
                byte[] pcm = new byte[(int) n];
                System.arraycopy(wav, body, pcm, 0, pcm.length);
                return Pcm.of(pcm, rate, channels);
            }
            pos = (int) Math.min(wav.length, body + size + (size & 1));
        }
        throw bad("no data chunk");
    }

    public static void write(Path file, Pcm pcm) {
        try {
            Files.write(file, bytes(pcm));
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    public static byte[] bytes(Pcm pcm) {
        int n = pcm.data().remaining();
        ByteBuffer b = ByteBuffer.allocate(44 + n).order(ByteOrder.LITTLE_ENDIAN);
        b.putInt(0x46464952).putInt(36 + n).putInt(0x45564157);
        b.putInt(0x20746d66).putInt(16).putShort((short) 1).putShort((short) pcm.channels()).putInt(pcm.sampleRate())
                .putInt(pcm.sampleRate() * pcm.channels() * 2).putShort((short) (pcm.channels() * 2)).putShort((short) 16);
        b.putInt(0x61746164).putInt(n).put(pcm.data().duplicate());
        return b.array();
    }

    private static KazeiaException bad(String why) {
        return new KazeiaException(ErrorCode.BAD_REQUEST, "WAV: " + why);
    }
}
